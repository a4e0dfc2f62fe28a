"""Helpers for files on disk that several packages share; imports nothing of the project.

- hashing: `file_sha256`, the digest token shards (data/shards.py, data/prepare.py) and
  checkpoint files (trainer/checkpoint/integrity.py) are recorded and verified with;
- oserrors: `explain_write_failure`, why a write failed in words (a checkpoint save, the
  metrics log).

The bottom layer: `models`, `data` and `trainer` may import it; it imports none of them.
"""

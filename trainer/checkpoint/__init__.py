"""Checkpointing: save, verify, find, resume and prune a run's checkpoints.

- checkpointer: `Checkpointer`, when to save, the atomic commit, resume selection, load, pruning
- layout: a checkpoint directory's names, completeness, listing, trainer_state.json, setting aside
- errors: `CheckpointError` and its kinds (corrupt, incompatible, failed save)
- integrity: integrity.json, the size and sha256 of every file, verified before anything is read
- compatibility: is the checkpoint's model the run's (model config, precision backend, layout)
- resume_changes: tokenizer, corpus and config changes on resume; this start's record names
- rng: every RNG state of a process as JSON

Why a write failed is said by fileio/oserrors.py, which the metrics log shares. The run
directory's lock (trainer/run_lock.py) is not here: it guards the whole run directory
(metrics, config, events and checkpoints) and is taken before any checkpoint is looked at.
The on-disk layout and the save, resume and prune rules: checkpointer.py; faults and their tests:
docs/reliability.md.
"""

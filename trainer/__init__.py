"""The distributed trainer: `python -m trainer +experiment=NAME` (see trainer/loop.py)."""

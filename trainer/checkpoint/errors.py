"""The exceptions of checkpointing; each message names the checkpoint's path and the reason."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or used; the message names its path and the reason."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint's files do not match what was written (or cannot be parsed)."""


class IncompatibleCheckpoint(CheckpointError):
    """A checkpoint holds another model than the run's."""


class CheckpointSaveError(CheckpointError):
    """A save failed; its partial directory was removed and older checkpoints are intact."""


class CheckpointDirectoryUnusable(CheckpointError):
    """The checkpoint directory cannot be written, or has no room for one checkpoint, at the start of a run."""

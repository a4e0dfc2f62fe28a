"""The one exception type of the data package: bad data or a bad data setup, with the culprit named."""

from __future__ import annotations


class DataError(ValueError):
    """Raised for missing, truncated or corrupt shards, mismatched tokenizers, empty sources and the like.

    Every message names the file, directory or config field at fault.
    """

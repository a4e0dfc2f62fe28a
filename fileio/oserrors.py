"""Say why a write failed: the OS error in an exception chain, or a full disk when nothing says so.

Writers bury the cause. DCP wraps each rank's exception in a CheckpointException; torch.save's
zip writer (DCP uses it for non-tensor items) reports a refused write as "unexpected pos 704 vs
598", with no errno. `explain_write_failure` walks causes, contexts and DCP's per-rank failures
for an OSError and names its errno in words ("no space left on device"); when there is none, it
says the disk is probably full if the filesystem holding the path has (almost) no space left,
or the file was probably too large if this process has a file-size limit (ulimit -f). The
caller runs it on the rank that failed: free space and limits are that rank's.
"""

from __future__ import annotations

import errno
import resource
import shutil
from pathlib import Path
from typing import Iterator, Optional

NEARLY_FULL_BYTES = 64 << 20
"""Free space under which an unexplained write failure is blamed on a full disk."""

_IN_WORDS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.EFBIG: "file too large (the file-size limit of this process or filesystem)",
    errno.EIO: "input/output error (failing disk or network filesystem)",
}


def _chained(error: BaseException) -> Iterator[BaseException]:
    """error, its causes and contexts, and the per-rank failures of a DCP CheckpointException."""
    seen, stack = set(), [error]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)  # DCP's CheckpointException: {rank: (exception, stack)}
        if isinstance(failures, dict):
            for failure in failures.values():
                stack.append(failure[0] if isinstance(failure, tuple) and failure else failure)


def find_os_error(error: BaseException) -> Optional[OSError]:
    for item in _chained(error):
        if isinstance(item, OSError) and item.errno is not None:
            return item
    return None


def free_bytes(path: Path) -> Optional[int]:
    """Bytes free to this user on the filesystem holding `path` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def explain_write_failure(error: BaseException, path: Path) -> str:
    """One line: why writing under `path` failed, in words, with the OS's own message."""
    os_error = find_os_error(error)
    if os_error is not None:
        words = _IN_WORDS.get(os_error.errno, errno.errorcode.get(os_error.errno, str(os_error.errno)))
        where = os_error.filename or path
        return f"{words} ({type(os_error).__name__} [Errno {os_error.errno}] {os_error.strerror}) writing {where}"
    said = f"the writer said: {type(error).__name__}: {str(error).strip()[-300:]}"
    free = free_bytes(path)
    if free is not None and free < NEARLY_FULL_BYTES:
        return f"no space left on device, most likely: the filesystem of {path} has {free} bytes free ({said})"
    size_limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if size_limit != resource.RLIM_INFINITY:
        return (f"file too large, most likely: this process may not write files over {size_limit} bytes "
                f"(ulimit -f) writing under {path} ({said})")
    return f"{type(error).__name__}: {error} (writing {path})"

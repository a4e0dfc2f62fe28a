"""Source text that is not valid UTF-8: say where it is, or mark it so that its document is dropped and counted.

Default: preparation stops at the first undecodable byte with a DataError naming the file, the
line and the byte offset (`undecodable_message` scans the source files for it; the cost is paid
only when preparation has already failed). The decoders of `datasets` and pyarrow say neither.

With data.skip_undecodable_documents: local json and text files are decoded with the error
handler registered here, which turns each undecodable byte sequence into UNDECODABLE_MARK, and
a document holding the mark is dropped at tokenization (prepare.tokenize_batch) and counted in
its chunk record and the manifest (`skipped_documents`). The mark is U+FDD0, a Unicode
noncharacter: reserved for exactly this kind of internal use, absent from text meant for
interchange (a document that does hold one is counted as undecodable too).
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
from pathlib import Path
from typing import IO, Iterable, Optional

UNDECODABLE_MARK = "\ufdd0"
ERROR_HANDLER = "hybrid_nvfp4_mark_undecodable"


def _mark_undecodable(error: UnicodeDecodeError):
    return UNDECODABLE_MARK, error.end


codecs.register_error(ERROR_HANDLER, _mark_undecodable)

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def _open_binary(path: Path) -> Optional[IO[bytes]]:
    suffix = path.suffix.lower()
    if suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            return None
        return zstandard.open(path, "rb")
    return _OPENERS.get(suffix, open)(path, "rb")


def is_decode_failure(error: BaseException) -> bool:
    """Whether a UnicodeDecodeError is in the error's chain (datasets wraps it in DatasetGenerationError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, UnicodeDecodeError) or "codec can't decode" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def locate_undecodable(files: Iterable[Path]) -> Optional[str]:
    """'<file> line <n> (byte <offset>): <reason>' of the first undecodable line, or None if all decode."""
    for path in files:
        handle = _open_binary(Path(path))
        if handle is None:
            continue
        with handle:
            offset = 0
            for number, line in enumerate(handle, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as error:
                    return (f"{path} line {number} (byte {offset + error.start}): {error.reason}: "
                            f"{line[max(0, error.start - 20):error.end + 20]!r}")
                offset += len(line)
    return None


def undecodable_message(where: str, files: Iterable[Path], error: BaseException) -> str:
    """The DataError text for a source whose text is not UTF-8, naming the place when the files show it."""
    located = locate_undecodable(files)
    place = located or f"({type(error).__name__}: {error})"
    return (f"{where}: text is not valid UTF-8 at {place}. Fix or re-encode the file, or set "
            "data.skip_undecodable_documents=true to drop such documents (they are counted in the manifest)")

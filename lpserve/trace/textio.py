"""Reading trace files as text: gzip detection, read errors that name the file, and the
refusal of non-regular files (layer 0)."""
from __future__ import annotations

import gzip
import io
import stat
import zlib
from pathlib import Path

from lpserve.trace.columns import TraceError

__all__ = ["READ_ERRORS", "open_text", "read_error", "check_regular_file"]

#: what reading a damaged (gzipped) text file can raise
READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError)


def open_text(path: Path) -> io.TextIOBase:
    """Text of ``path``, gunzipped when it starts with the gzip magic; a UTF-8 byte-order
    mark is dropped."""
    with open(path, "rb") as fb:
        magic = fb.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, "rt", encoding="utf-8-sig", newline="")


def read_error(path: Path, exc: BaseException, where: str = "") -> TraceError:
    """A :class:`TraceError` naming ``path`` (and ``where``, e.g. a line) for a read
    failure ``exc``: truncated gzip, corrupt gzip, invalid UTF-8, an OS error."""
    if isinstance(exc, EOFError):
        what = f"truncated gzip stream ({exc})"
    elif isinstance(exc, (zlib.error, gzip.BadGzipFile)):
        what = f"corrupt gzip stream ({exc})"
    elif isinstance(exc, UnicodeDecodeError):
        what = f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset " \
               f"{exc.start} of a chunk: {exc.reason})"
        if exc.start == 0 and exc.object[:2] in (b"\xff\xfe", b"\xfe\xff"):
            what += "; it starts with a UTF-16 byte-order mark: save it as UTF-8"
    else:
        what = f"{type(exc).__name__}: {exc}"
    return TraceError(f"{path}: {where + ': ' if where else ''}cannot read: {what}")


def check_regular_file(path: Path) -> None:
    """Refuse what is not a regular file (a FIFO, a device, a socket): opening or reading
    it could block forever or never end. FileNotFoundError / TraceError name ``path``."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot access: {exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(f"{path}: is a directory, not a trace file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "a device or special file")
        raise TraceError(f"{path}: is {kind}, not a regular file; lpserve reads trace files "
                         "only (copy the data to a file first)")

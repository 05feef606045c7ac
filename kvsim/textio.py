"""Read a user's text file as UTF-8, or fail with one line that names the file (never a traceback).

Profiles, model files and trace files all come from users; a missing file, a permission problem, a
directory where a file should be, or bytes that are not UTF-8 are input errors, not kvsim bugs.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import KvsimError

__all__ = ["decode_utf8", "read_bytes", "read_utf8"]


def read_bytes(path: Path, shown: str, error: type[KvsimError]) -> bytes:
    """The file's bytes; ``error`` (one line naming ``shown``) when it cannot be read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise error(f"{shown}: is a directory, not a file") from None
    except OSError as exc:  # permission denied, I/O error
        raise error(f"{shown}: cannot read: {exc.strerror or exc}") from None


def decode_utf8(raw: bytes, shown: str, error: type[KvsimError], line_base: int = 1) -> str:
    """``raw`` as text; ``error`` naming the line and the first byte that is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = line_base + raw.count(b"\n", 0, exc.start)
        raise error(
            f"{shown}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8"
        ) from None


def read_utf8(path: Path, shown: str, error: type[KvsimError]) -> str:
    """A whole UTF-8 text file, with one-line errors for every way reading it can fail."""
    return decode_utf8(read_bytes(path, shown, error), shown, error)

"""Read a user's text file as UTF-8, or fail with one line that names the file (never a traceback).

Profiles, model files and trace files all come from users; a missing file, a permission problem, a
directory where a file should be, bytes that are not UTF-8, or JSON and TOML nested deeper than the
parsers can recurse are input errors, not kvsim bugs.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from kvsim.errors import KvsimError

__all__ = [
    "decode_utf8",
    "exists",
    "key_name",
    "one_line",
    "parse_json",
    "parse_toml",
    "read_bytes",
    "read_utf8",
]


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
    except ValueError:  # a NUL byte: no system can open such a name
        raise error(f"{shown}: no such file (the name holds a NUL byte)") from None


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


def one_line(text: object) -> str:
    """A message from a library (pyarrow, the csv module) or a user's key on one line: every run
    of whitespace, newlines included, becomes one space."""
    return " ".join(str(text).split())


def parse_json(raw: str | bytes) -> Any:
    """``json.loads``; nesting too deep for the parser is a ValueError like any other bad JSON.

    ``json.loads`` raises RecursionError for ``[[[[…`` thousands deep, which is not a ValueError
    and would escape every reader's ``except ValueError`` as a kvsim bug.
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def parse_toml(text: str, shown: str, error: type[KvsimError], what: str = "invalid TOML") -> Any:
    """``tomllib.loads``; a syntax error or nesting too deep is ``error`` naming ``shown``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # the message carries "(at line N, column M)"
        raise error(f"{shown}: {what}: {one_line(exc)}") from None
    except RecursionError:
        raise error(f"{shown}: {what}: nested too deeply to parse") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise error(f"{shown}: {what}: {one_line(exc)}") from None


def exists(path: Path) -> bool:
    """``path.exists()``, but False for a name the system cannot even look up (longer than the
    file-name limit, or holding a NUL byte) instead of an OSError or ValueError."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def key_name(key: str) -> str:
    """A user's key in an error message: as written, or its repr when it holds a newline or
    another character that would break the one-line message."""
    return key if key.isprintable() else repr(key)

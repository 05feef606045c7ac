"""Shared checks for the input-validation tests: one-line errors, and files that cannot be read."""

from __future__ import annotations

import builtins
import pathlib
from pathlib import Path

import pytest

from kvsim.errors import KvsimError


def one_line(exc: pytest.ExceptionInfo[KvsimError], *fragments: str) -> str:
    """The error's message, checked to be one line holding every fragment."""
    message = str(exc.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def deny_reading(monkeypatch: pytest.MonkeyPatch, victim: Path) -> None:
    """Make opening ``victim`` raise PermissionError, as chmod 000 would for anyone but root.

    The tests run as root in some places, where chmod stops nothing, so the Python entry points
    kvsim reads through (``Path.open``, ``Path.read_bytes``, ``open``) are patched instead.
    """
    real_read_bytes = pathlib.Path.read_bytes
    real_open = pathlib.Path.open
    real_builtin_open = builtins.open
    target = victim.resolve()

    def denied() -> PermissionError:
        return PermissionError(13, "Permission denied", str(victim))

    def read_bytes(self: Path) -> bytes:
        if self.resolve() == target:
            raise denied()
        return real_read_bytes(self)

    def path_open(self: Path, *args, **kwargs):
        if self.resolve() == target:
            raise denied()
        return real_open(self, *args, **kwargs)

    def builtin_open(file, *args, **kwargs):
        if isinstance(file, str | Path) and Path(file).resolve() == target:
            raise denied()
        return real_builtin_open(file, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    monkeypatch.setattr(pathlib.Path, "open", path_open)
    monkeypatch.setattr(builtins, "open", builtin_open)

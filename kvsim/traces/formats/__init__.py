"""Trace file formats by name: one reader class per file behind one registry, detection from a
file's name and first bytes, and third-party formats through the `kvsim.trace_formats` entry
points.

Adding a format: a module with a `TraceFormat` subclass (see `base` and any file beside this one),
and one line below, or `register(MyFormat)` from outside kvsim (examples/extend/trace_format.py).
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import TraceError, UnknownNameError
from kvsim.plugins import Registry
from kvsim.traces.formats.azure import Azure
from kvsim.traces.formats.bailian import QwenBailian
from kvsim.traces.formats.base import Head, ReadOptions, TraceFormat
from kvsim.traces.formats.burstgpt import BurstGPT
from kvsim.traces.formats.canonical import Canonical
from kvsim.traces.formats.dynamo import Dynamo
from kvsim.traces.formats.jsonl import Jsonl
from kvsim.traces.formats.lmsys import Lmsys
from kvsim.traces.formats.mooncake import Mooncake
from kvsim.traces.formats.sharegpt import ShareGPT
from kvsim.traces.formats.swe_agent import SweAgent

__all__ = [
    "Head",
    "ReadOptions",
    "TraceFormat",
    "builtin_format_names",
    "detect_format",
    "format_names",
    "get_format",
    "register",
]

_REGISTRY: Registry[TraceFormat] = Registry("trace format", TraceFormat, "kvsim.trace_formats")
register = _REGISTRY.register

# Registration order is the order error messages list formats in, and the order detection asks
# formats that match a file's name (catch-alls last).
for _cls in (Canonical, Jsonl, Mooncake, ShareGPT, Lmsys, Azure, BurstGPT, Dynamo, SweAgent,
             QwenBailian):  # fmt: skip
    register(_cls)


def builtin_format_names() -> list[str]:
    """The formats that ship with kvsim, or were registered since, in registration order."""
    return list(_REGISTRY.builtins)


def format_names() -> list[str]:
    """Every name `get_format` accepts: registered formats in order, then installed plugins."""
    return [*_REGISTRY.builtins, *sorted(set(_REGISTRY.plugins()) - set(_REGISTRY.builtins))]


def get_format(name: str) -> TraceFormat:
    """The reader for a registered or installed format; UnknownNameError listing the valid ones."""
    if name not in _REGISTRY.builtins and name not in _REGISTRY.plugins():
        raise UnknownNameError("trace format", name, format_names())
    return _REGISTRY.resolve(name)()


def detect_format(path: Path) -> str:
    """The format of `path`, from its name and first bytes; TraceError when no format takes it.

    Formats are asked only about paths their `suffixes` match (or folders, for those that read
    folders): registered ones in order, then plugins, catch-alls last; the first whose `sniff`
    says yes wins.
    """
    head = Head(path)
    candidates = [fmt for fmt in map(get_format, format_names()) if _matches(fmt, head)]
    for fmt in sorted(candidates, key=lambda fmt: fmt.catch_all):  # stable: order kept
        if fmt.sniff(path, head):
            return fmt.name
    reason = candidates[0].unrecognized(path, head, candidates) if candidates else None
    raise TraceError(
        reason or f"{path}: unknown trace format; pass a format ({', '.join(format_names())})"
    )


def _matches(fmt: TraceFormat, head: Head) -> bool:
    return fmt.folders if head.is_dir else head.name.endswith(fmt.suffixes)

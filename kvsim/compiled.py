"""The hot-path modules that an optional build compiles to C with mypyc, and which of them
this process runs compiled.

kvsim is pure Python. `KVSIM_COMPILE=1 python setup.py build_ext --inplace` in a checkout
(README, "Compiled build") compiles the modules below beside their sources, where Python imports
them first. Results are the same bits: CI runs benchmarks/result_digests.py under both builds and
compares them. These modules must type-check (setup.py; pyproject.toml's `[tool.mypy]`), and
their annotations must hold at run time: a compiled function checks its arguments' types.

This module imports nothing from kvsim: setup.py reads `HOT_MODULES` from it at build time, and
kvsim's `__init__` asks it for stale extensions before anything is imported.
"""

from __future__ import annotations

import importlib
import json
from hashlib import sha256
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

# A compiled class takes no interpreted subclass and does not pickle: what a sharded window
# sends back to its caller (kvsim.metrics: the request log, timeline, attribution) stays
# interpreted.
HOT_MODULES = (
    "kvsim.kvcache.block_pool",
    "kvsim.kvcache.group_pool",  # subclasses BlockPool: a compiled class takes no interpreted one
    "kvsim.kvcache.compact_tier",
    "kvsim.kvcache.hierarchy",
    "kvsim.kvcache.link",
    "kvsim.kvcache.manager",
    "kvsim.engine.scheduler",
    "kvsim.engine.pricing",
    "kvsim.costmodel.kernels",
    "kvsim.costmodel.roofline",
    "kvsim.costmodel.engine_terms",
    "kvsim.engine.cluster",
    "kvsim.engine.workload",
    "kvsim.engine.warmup",  # WarmView subclasses cluster's LiveView
    "kvsim.kvcache.request",
    "kvsim.kvcache.block_table",
)

_ROOT = Path(__file__).resolve().parent.parent
#: the sources' digests when the extensions beside them were built (setup.py writes it)
RECORD = _ROOT / "kvsim" / "compiled_sources.json"


def compiled_modules() -> list[str]:
    """The modules of `HOT_MODULES` that this process imported from a compiled extension."""
    return [
        name
        for name in HOT_MODULES
        if str(importlib.import_module(name).__file__).endswith(tuple(EXTENSION_SUFFIXES))
    ]


def source_digests() -> dict[str, str]:
    """Each hot module's source, hashed: what setup.py records next to the extensions it
    builds, and what `stale_extensions` compares against."""
    return {name: sha256(_source(name).read_bytes()).hexdigest() for name in HOT_MODULES}


def stale_extensions() -> list[str]:
    """Compiled modules whose source changed since they were built: Python would go on running
    the old code. Compares content, not times, so a checkout that rewrites a file unchanged
    is not stale."""
    built = [name for name in HOT_MODULES if _extension(name) is not None]
    if not built:
        return []
    record = RECORD.read_text() if RECORD.exists() else "{}"
    digests, now = json.loads(record), source_digests()
    return [name for name in built if digests.get(name) != now[name]]


def _source(name: str) -> Path:
    return _ROOT.joinpath(*name.split(".")).with_suffix(".py")


def _extension(name: str) -> Path | None:
    source = _source(name)
    for suffix in EXTENSION_SUFFIXES:
        built = source.with_name(source.stem + suffix)
        if built.exists():
            return built
    return None

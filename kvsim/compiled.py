"""The hot-path modules that an optional build compiles to C with mypyc, and which of them
this process runs compiled.

kvsim is pure Python. A non-editable install with `KVSIM_COMPILE=1` (README, "Compiled build")
compiles the modules below: the per-block work of the block pool and the lower tiers, where a
fleet run spends about 40 % of its self time (cProfile), for 15 % fewer instructions in all. The
results are the same bits: CI runs benchmarks/result_digests.py under both builds and compares
them. These modules must type-check (setup.py; pyproject.toml's `[tool.mypy]`), and their
annotations must hold at run time: a compiled function checks its arguments' declared types.

This module imports nothing from kvsim: setup.py reads `HOT_MODULES` from it at build time.
"""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES

HOT_MODULES = (
    "kvsim.kvcache.block_pool",
    "kvsim.kvcache.group_pool",  # subclasses BlockPool: a compiled class takes no interpreted one
    "kvsim.kvcache.compact_tier",
    "kvsim.kvcache.hierarchy",
    "kvsim.kvcache.link",
    "kvsim.kvcache.manager",
)


def compiled_modules() -> list[str]:
    """The modules of `HOT_MODULES` that this process imported from a compiled extension."""
    return [
        name
        for name in HOT_MODULES
        if str(importlib.import_module(name).__file__).endswith(tuple(EXTENSION_SUFFIXES))
    ]

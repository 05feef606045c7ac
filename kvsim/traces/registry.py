"""Trace names → loaders, and `load_trace`, the one entry point the rest of kvsim uses.

Data files live in `traces/` at the repository root; the `KVSIM_TRACES` environment variable
points elsewhere. `load_trace` also takes a path: a canonical `.parquet` or a Mooncake-format
`.jsonl`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

import kvsim
from kvsim.errors import KvsimError, TraceError, UnknownNameError
from kvsim.traces.mooncake import load_mooncake
from kvsim.traces.schema import Trace, read_trace
from kvsim.traces.sharegpt import load_sharegpt

__all__ = ["load_trace", "register_trace", "trace_names", "traces_dir"]


@dataclass(frozen=True)
class _Options:
    max_requests: int | None
    rate: float | None
    rate_scale: float
    seed: int


#: A loader gets the data directory and the checked options.
Loader = Callable[[Path, _Options], Trace]
_LOADERS: dict[str, Loader] = {}


def register_trace(name: str, loader: Loader) -> None:
    """Add a named trace; a name registered twice is a bug, so it raises."""
    if name in _LOADERS:
        raise ValueError(f"trace {name!r} is already registered")
    _LOADERS[name] = loader


def trace_names() -> list[str]:
    return sorted(_LOADERS)


def traces_dir() -> Path:
    """Where the shipped trace files are: `$KVSIM_TRACES`, else `<repo>/traces`."""
    override = os.environ.get("KVSIM_TRACES")
    if override:
        return Path(override)
    return Path(kvsim.__file__).resolve().parents[1] / "traces"


def _shown(path: Path, root: Path) -> str:
    """How errors name a data file: relative to the repository root when it is inside it."""
    try:
        return str(path.resolve().relative_to(root.resolve().parent))
    except ValueError:
        return str(path)


def _mooncake(relpath: str, name: str) -> Loader:
    def load(root: Path, opts: _Options) -> Trace:
        path = root / relpath
        return load_mooncake(
            path,
            name=name,
            shown=_shown(path, root),
            max_requests=opts.max_requests,
            rate=opts.rate,
            rate_scale=opts.rate_scale,
        )

    return load


def _sharegpt(root: Path, opts: _Options) -> Trace:
    path = root / "sharegpt" / "ShareGPT_V3_filtered_500.json"
    return load_sharegpt(
        path,
        shown=_shown(path, root),
        max_requests=opts.max_requests,
        rate=opts.rate,
        rate_scale=opts.rate_scale,
        seed=opts.seed,
    )


register_trace("sharegpt", _sharegpt)
register_trace(
    "mooncake-conversation", _mooncake("mooncake/conversation_trace.jsonl", "mooncake-conversation")
)
register_trace(
    "mooncake-synthetic", _mooncake("mooncake/synthetic_trace.jsonl", "mooncake-synthetic")
)
register_trace(
    "mooncake-arxiv-1000", _mooncake("mooncake/mooncake_trace_1000.jsonl", "mooncake-arxiv-1000")
)


def _check_options(max_requests: int | None, rate: float | None, rate_scale: float) -> None:
    if max_requests is not None and (isinstance(max_requests, bool) or max_requests < 1):
        raise KvsimError(f"option 'max_requests' must be >= 1, got {max_requests!r}")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise KvsimError(f"option 'rate' must be a positive number, got {rate!r}")
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise KvsimError(f"option 'rate_scale' must be a positive number, got {rate_scale!r}")


def _load_parquet(path: Path, opts: _Options) -> Trace:
    if opts.rate is not None:
        raise KvsimError(
            f"option 'rate' does not apply to a stored trace ({path}); use 'rate_scale'"
        )
    trace = read_trace(path)
    table = trace.table
    if opts.max_requests is not None:
        table = table.slice(0, opts.max_requests)
    if opts.rate_scale != 1.0:
        index = table.schema.get_field_index("arrival_s")
        scaled = np.asarray(table.column("arrival_s").to_numpy()) / opts.rate_scale
        table = table.set_column(index, table.schema.field(index), pa.array(scaled, pa.float64()))
    return Trace.from_table(table, str(path))


def load_trace(
    name_or_path: str | os.PathLike[str],
    *,
    max_requests: int | None = None,
    rate: float | None = None,
    rate_scale: float = 1.0,
    seed: int = 0,
) -> Trace:
    """Load a named trace or a trace file as a canonical `Trace`.

    `max_requests` keeps the first N requests; `rate` sets the arrival rate (sessions/s for
    `sharegpt`, mean requests/s for Mooncake replays); `rate_scale` multiplies the rate (divides
    arrival times); `seed` drives generated traces.
    """
    _check_options(max_requests, rate, rate_scale)
    opts = _Options(max_requests, rate, rate_scale, seed)
    key = os.fspath(name_or_path)
    if key in _LOADERS:
        return _LOADERS[key](traces_dir(), opts)
    path = Path(key)
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".jsonl") or path.exists():
        if not path.is_file():
            raise TraceError(f"{path}: no such trace file")
        if suffix == ".parquet":
            return _load_parquet(path, opts)
        if suffix == ".jsonl":
            return load_mooncake(path, max_requests=max_requests, rate=rate, rate_scale=rate_scale)
        raise TraceError(f"{path}: unknown trace format; expected .parquet or Mooncake .jsonl")
    raise UnknownNameError("trace", key, trace_names())

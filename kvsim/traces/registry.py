"""Trace names → loaders, and `load_trace`, the one entry point kvsim uses.

Data files live in `traces/` at the repository root; the `KVSIM_TRACES` environment variable
points elsewhere. `load_trace` also takes a path in any registered format
(`kvsim.traces.formats`), detected from the name and first bytes unless `format` is given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import kvsim
from kvsim.errors import KvsimError, TraceError, UnknownNameError
from kvsim.textio import exists
from kvsim.traces.agentic import AgenticParams, generate_agentic
from kvsim.traces.arrivals import check_arrival, make_process, retime_table
from kvsim.traces.azure import read_azure
from kvsim.traces.common import Chunked, RowErrors
from kvsim.traces.dynamo import read_dynamo
from kvsim.traces.formats import ReadOptions, builtin_format_names, detect_format, get_format
from kvsim.traces.lmsys import LmsysParams, generate_lmsys, lmsys_sessions, stream_lmsys
from kvsim.traces.mooncake import load_mooncake
from kvsim.traces.replay import collect, replay, session_starts
from kvsim.traces.schema import Trace
from kvsim.traces.sharegpt import load_sharegpt
from kvsim.traces.toolagent import ToolAgentParams, generate_toolagent

__all__ = [
    "FORMATS",
    "TraceInfo",
    "collect",
    "detect_format",
    "load_trace",
    "open_source",
    "register_trace",
    "run_requests",
    "stream_lmsys_trace",
    "trace_info",
    "trace_names",
    "traces_dir",
]

#: The file formats that ship with kvsim (`kvsim.traces.formats.format_names` adds plugins).
FORMATS = tuple(builtin_format_names())

#: A loader gets the data directory and the checked options.
Loader = Callable[[Path, ReadOptions], Trace]


@dataclass(frozen=True)
class TraceInfo:
    name: str
    summary: str  # one line: what is real and what is drawn
    loader: Loader
    #: Requests a run replays when it names no count (None: the whole trace). `load_trace` keeps
    #: returning the whole trace; only runs default to this, so a first `kvsim run` takes
    #: seconds while the trace's KV still overflows HBM (issue 13).
    run_requests: int | None = None


_LOADERS: dict[str, TraceInfo] = {}


def register_trace(
    name: str, loader: Loader, summary: str = "", run_requests: int | None = None
) -> None:
    """Add a named trace; a name registered twice is a bug, so it raises."""
    if name in _LOADERS:
        raise ValueError(f"trace {name!r} is already registered")
    _LOADERS[name] = TraceInfo(name, summary, loader, run_requests)


def run_requests(name: str) -> int | None:
    """How many requests a run of trace `name` replays by default (None: all, or not a name)."""
    info = _LOADERS.get(name)
    return info.run_requests if info else None


def trace_names() -> list[str]:
    return sorted(_LOADERS)


def trace_info(name: str) -> TraceInfo:
    if name not in _LOADERS:
        raise UnknownNameError("trace", name, trace_names())
    return _LOADERS[name]


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


# --- built-ins ----------------------------------------------------------------------------------


def _mooncake(relpath: str, name: str) -> Loader:
    def load(root: Path, opts: ReadOptions) -> Trace:
        path = root / relpath
        return load_mooncake(
            path,
            name=name,
            shown=_shown(path, root),
            max_requests=opts.max_requests,
            rate=opts.rate,
            rate_scale=opts.rate_scale,
            errors=RowErrors(skip=opts.skip_bad_rows),
        )

    return load


def _sharegpt(root: Path, opts: ReadOptions) -> Trace:
    path = root / "sharegpt" / "ShareGPT_V3_filtered_500.json"
    return load_sharegpt(
        path,
        shown=_shown(path, root),
        max_requests=opts.max_requests,
        rate=opts.rate,
        rate_scale=opts.rate_scale,
        seed=opts.seed,
    )


def _first_sessions(sessions: int, per_session: float, want: int) -> int:
    """How many sessions `_grow` tries first for `want` requests (a quarter to spare)."""
    return max(sessions, math.ceil(want / per_session * 1.25) + 8)


def _grow(make: Callable[[int], Trace], sessions: int, per_session: float, want: int | None):
    """Generate enough sessions to hold `want` requests (doubling until it does)."""
    if want is None:
        return make(sessions)
    sessions = _first_sessions(sessions, per_session, want)
    while True:
        trace = make(sessions)
        if len(trace) >= want:
            return trace
        sessions *= 2


def _sessions(generate: Callable[..., Trace], base: Any, per_session: float) -> Loader:
    """A loader for a session generator: the option rate, and enough sessions for the request
    count asked for."""

    def load(root: Path, opts: ReadOptions) -> Trace:
        rate = (opts.rate or base.rate) * opts.rate_scale
        return _grow(
            lambda n: generate(replace(base, sessions=n, rate=rate), seed=opts.seed,
                               max_requests=opts.max_requests),
            base.sessions, per_session, opts.max_requests,
        )  # fmt: skip

    return load


_lmsys = _sessions(generate_lmsys, LmsysParams(), LmsysParams().mean_turns)
_agentic = _sessions(generate_agentic, AgenticParams(), 9.0)  # calls per session, roughly


def stream_lmsys_trace(
    max_requests: int, *, seed: int = 0, rate: float | None = None, chunk_sessions: int = 50_000
) -> Chunked:
    """`load_trace('lmsys', max_requests=..., seed=..., rate=...)` as a stream of chunks.

    The same sessions as the loader draws (`_grow`'s count, from the turns alone) and the same
    draws; `convert_to_parquet(source, out, max_requests=max_requests)` writes the same table
    without building it.
    """
    _check_options(max_requests, rate, 1.0)
    base = LmsysParams()
    first = _first_sessions(base.sessions, base.mean_turns, max_requests)
    params = replace(base, sessions=first, rate=rate or base.rate)
    params = replace(params, sessions=lmsys_sessions(params, seed, max_requests))
    return stream_lmsys(params, seed=seed, chunk_sessions=chunk_sessions)


def _toolagent(root: Path, opts: ReadOptions) -> Trace:
    base = ToolAgentParams()
    rate = (opts.rate or base.rate) * opts.rate_scale
    return generate_toolagent(replace(base, rate=rate), seed=opts.seed, requests=opts.max_requests)


def _file(relpath: str, reader: Callable[..., Chunked], name: str) -> Loader:
    def load(root: Path, opts: ReadOptions) -> Trace:
        path = root / relpath
        source = reader(path, name=name, shown=_shown(path, root),
                        skip_bad_rows=opts.skip_bad_rows)  # fmt: skip
        return replay(collect(source), opts)

    return load


register_trace(
    "sharegpt", _sharegpt,
    "real: 500 ShareGPT first-turn prompt lengths; drawn: turns, later prompts, replies "
    "(WildChat moments), Poisson session starts, think times",
)  # fmt: skip
register_trace(
    "lmsys", _lmsys,
    "drawn: LMSYS-Chat-1M turns, prompt and reply lengths from published moments (raw data is "
    "gated), Poisson session starts, think times",
)  # fmt: skip
register_trace(
    "agentic", _agentic,
    "drawn: coding-agent sessions (shared system prompt, tool loop, waits, subagents) shaped by "
    "the Pi and SWE-agent samples",
)  # fmt: skip
register_trace(
    "mooncake-conversation",
    _mooncake("mooncake/conversation_trace.jsonl", "mooncake-conversation"),
    "real: Kimi chat arrivals, lengths and 512-token prefix hashes (12,031 requests, 59 min)",
    run_requests=1_000,
)
register_trace(
    "mooncake-synthetic",
    _mooncake("mooncake/synthetic_trace.jsonl", "mooncake-synthetic"),
    "real: lengths and prefix hashes of Moonshot's ShareGPT/L-Eval/LooGLE mix; Poisson arrivals",
    run_requests=1_000,
)
register_trace(
    "mooncake-arxiv-1000",
    _mooncake("mooncake/mooncake_trace_1000.jsonl", "mooncake-arxiv-1000"),
    "real: first 1,000 rows of Mooncake's arXiv trace (arrivals, lengths, prefix hashes)",
)
register_trace(
    "mooncake-toolagent", _toolagent,
    "drawn: Mooncake tool&agent stand-in (23,608 calls, shared tool prefixes, growing histories) "
    "fitted to published means, medians and cache ratio",
    run_requests=1_500,
)  # fmt: skip
register_trace(
    "azure-conv",
    _file("azure/AzureLLMInferenceTrace_conv.csv", read_azure, "azure-conv"),
    "real: Azure 2023 conversation arrivals and lengths (19,366 requests); no prefix data",
)
register_trace(
    "azure-code",
    _file("azure/AzureLLMInferenceTrace_code.csv", read_azure, "azure-code"),
    "real: Azure 2023 code-completion arrivals and lengths (8,819 requests); no prefix data",
)
register_trace(
    "pi-coding-agent",
    _file("dynamo/pi_request_trace.jsonl.gz", read_dynamo, "pi-coding-agent"),
    "real: a Pi coding-agent run on Dynamo (17 calls, root + 3 subagents), 16-token prefix "
    "hashes, tool gaps as think time",
)


# --- files in any format ------------------------------------------------------------------------


def open_source(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    seed: int = 0,
    rate: float | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    skip_bad_rows: bool = False,
) -> Chunked | Trace:
    """A trace file as a stream of chunks (text and CSV formats) or a loaded Trace."""
    if not os.fspath(path).strip():
        raise TraceError("trace path: expected a file, got ''")
    path = Path(path)
    if not exists(path):
        raise TraceError(f"{path}: no such trace file")
    reader = get_format(format or detect_format(path))
    options = ReadOptions(rate=rate, seed=seed, skip_bad_rows=skip_bad_rows, tokenizer=tokenizer)
    return reader.open(path, options)


# --- options --------------------------------------------------------------------------------------


def _check_options(max_requests: int | None, rate: float | None, rate_scale: float) -> None:
    if max_requests is not None and (isinstance(max_requests, bool) or max_requests < 1):
        raise KvsimError(f"option 'max_requests' must be >= 1, got {max_requests!r}")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise KvsimError(f"option 'rate' must be a positive number, got {rate!r}")
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise KvsimError(f"option 'rate_scale' must be a positive number, got {rate_scale!r}")


def _load_path(path: Path, opts: ReadOptions, fmt: str | None) -> Trace:
    if not exists(path):
        raise TraceError(f"{path}: no such trace file")
    return get_format(fmt or detect_format(path)).load(path, opts)


def load_trace(
    name_or_path: str | os.PathLike[str],
    *,
    max_requests: int | None = None,
    rate: float | None = None,
    rate_scale: float = 1.0,
    seed: int = 0,
    arrival: str | None = None,
    cv: float | None = None,
    format: str | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    skip_bad_rows: bool = False,
) -> Trace:
    """Load a named trace or a trace file as a canonical `Trace`.

    `max_requests` keeps the first N requests; `rate` sets the arrival rate (sessions/s; for a
    replayed trace it stretches the real times to that mean rate); `rate_scale` multiplies the
    rate; `seed` drives generated traces and drawn times. `arrival` picks an arrival model
    (`replay`, `poisson`, `gamma` with `cv`, `servegen[:GROUP/CHUNK]`; default: the trace's own
    times); sessions keep their turn order and think times under every model. `format` forces a
    file format (default: detected); `tokenizer` is a tokenizer.json for text sources;
    `skip_bad_rows` counts malformed rows (`Trace.skipped_rows`) instead of failing.
    """
    _check_options(max_requests, rate, rate_scale)
    check_arrival(arrival, cv)
    if not os.fspath(name_or_path).strip():
        # Path("") is the current directory: never read it by accident.
        raise UnknownNameError("trace", os.fspath(name_or_path), [*trace_names(), "a file path"])
    model = None if arrival is None else arrival.partition(":")[0]
    retimed = model not in (None, "replay")
    # With a new arrival model, load everything first: the first N by the new times differ.
    opts = ReadOptions(None if retimed else max_requests, None if retimed else rate,
                       1.0 if retimed else rate_scale, seed, skip_bad_rows, tokenizer)  # fmt: skip
    key = os.fspath(name_or_path)
    if key in _LOADERS:
        trace = _LOADERS[key].loader(traces_dir(), opts)
    elif format is not None or Path(key).suffix or exists(Path(key)):
        trace = _load_path(Path(key), opts, format)
    else:
        raise UnknownNameError("trace", key, trace_names())
    if not retimed:
        return trace
    starts = session_starts(trace.table)
    if rate is None:
        span = float(starts[-1] - starts[0]) if starts.size > 1 else 0.0
        if span <= 0:
            raise KvsimError(f"option 'arrival' {arrival!r} needs option 'rate' for {key}")
        rate = (starts.size - 1) / span
    process = make_process(arrival, rate=rate * rate_scale, cv=cv, seed=seed, root=traces_dir())
    table = retime_table(trace.table, process)
    meta = dict(table.schema.metadata or {})
    meta[b"kvsim.description"] = (
        trace.description + f"; session starts re-drawn: {arrival}"
        + (f" cv {cv:g}" if cv is not None else "") + f" at {rate * rate_scale:g}/s"
    ).encode()  # fmt: skip
    table = table.replace_schema_metadata(meta)
    if max_requests is not None:
        table = table.slice(0, max_requests)
    return Trace.from_table(table, key)

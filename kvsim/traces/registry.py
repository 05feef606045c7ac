"""Trace names → loaders, format detection, and `load_trace`, the one entry point kvsim uses.

Data files live in `traces/` at the repository root; the `KVSIM_TRACES` environment variable
points elsewhere. `load_trace` also takes a path in any supported format (`FORMATS`), detected from
the name and first bytes unless `format` is given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import kvsim
from kvsim.errors import KvsimError, TraceError, UnknownNameError
from kvsim.textio import decode_utf8, exists, one_line, parse_json
from kvsim.traces.agentic import AgenticParams, generate_agentic
from kvsim.traces.arrivals import check_arrival, make_process, retime_table
from kvsim.traces.azure import read_azure
from kvsim.traces.burstgpt import read_burstgpt
from kvsim.traces.chat import ChatTiming, read_lmsys, read_sharegpt_json
from kvsim.traces.common import Chunked, Requests, RowErrors, iter_lines
from kvsim.traces.dynamo import read_dynamo
from kvsim.traces.jsonl import read_jsonl
from kvsim.traces.lmsys import LmsysParams, generate_lmsys
from kvsim.traces.mooncake import load_mooncake
from kvsim.traces.schema import META_SKIPPED, Trace, read_trace
from kvsim.traces.sharegpt import load_sharegpt
from kvsim.traces.swe_agent import read_swe_agent
from kvsim.traces.text import make_counter
from kvsim.traces.toolagent import ToolAgentParams, generate_toolagent

__all__ = [
    "FORMATS",
    "TraceInfo",
    "detect_format",
    "load_trace",
    "open_source",
    "register_trace",
    "run_requests",
    "trace_info",
    "trace_names",
    "traces_dir",
]

FORMATS = ("canonical", "jsonl", "mooncake", "sharegpt", "lmsys", "azure", "burstgpt", "dynamo",
           "swe-agent")  # fmt: skip


@dataclass(frozen=True)
class _Options:
    max_requests: int | None
    rate: float | None
    rate_scale: float
    seed: int
    skip_bad_rows: bool = False


#: A loader gets the data directory and the checked options.
Loader = Callable[[Path, _Options], Trace]


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


def collect(source: Chunked, max_requests: int | None = None) -> Trace:
    """Gather a chunked source into one canonical Trace (first `max_requests` by arrival)."""
    parts: list[Requests] = []
    settled = 0
    for req, frontier in source.chunks:
        parts.append(req)
        settled += int((req.arrival_s < frontier).sum())
        if max_requests is not None and settled >= max_requests and math.isfinite(frontier):
            pending = Requests.concat(parts)
            # Rows past the frontier may still be preceded by rows of later chunks: stop only
            # when the first N are all before it.
            if np.sort(pending.arrival_s)[max_requests - 1] < frontier:
                break
    req = Requests.concat(parts)
    if not len(req):
        raise source.no_requests()
    table = req.to_table(
        name=source.name,
        native_block_size=source.native_block_size,
        description=source.description,
    )
    if max_requests is not None:
        table = table.slice(0, max_requests)
    if source.errors.count:
        meta = dict(table.schema.metadata or {})
        meta[META_SKIPPED] = str(source.errors.count).encode()
        table = table.replace_schema_metadata(meta)
    return Trace.from_table(table, source.name)


# --- built-ins ----------------------------------------------------------------------------------


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
            errors=RowErrors(skip=opts.skip_bad_rows),
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


def _grow(make: Callable[[int], Trace], sessions: int, per_session: float, want: int | None):
    """Generate enough sessions to hold `want` requests (doubling until it does)."""
    if want is None:
        return make(sessions)
    sessions = max(sessions, math.ceil(want / per_session * 1.25) + 8)
    while True:
        trace = make(sessions)
        if len(trace) >= want:
            return trace
        sessions *= 2


def _sessions(generate: Callable[..., Trace], base: Any, per_session: float) -> Loader:
    """A loader for a session generator: the option rate, and enough sessions for the request
    count asked for."""

    def load(root: Path, opts: _Options) -> Trace:
        rate = (opts.rate or base.rate) * opts.rate_scale
        return _grow(
            lambda n: generate(replace(base, sessions=n, rate=rate), seed=opts.seed,
                               max_requests=opts.max_requests),
            base.sessions, per_session, opts.max_requests,
        )  # fmt: skip

    return load


_lmsys = _sessions(generate_lmsys, LmsysParams(), LmsysParams().mean_turns)
_agentic = _sessions(generate_agentic, AgenticParams(), 9.0)  # calls per session, roughly


def _toolagent(root: Path, opts: _Options) -> Trace:
    base = ToolAgentParams()
    rate = (opts.rate or base.rate) * opts.rate_scale
    return generate_toolagent(replace(base, rate=rate), seed=opts.seed, requests=opts.max_requests)


def _file(relpath: str, reader: Callable[..., Chunked], name: str) -> Loader:
    def load(root: Path, opts: _Options) -> Trace:
        path = root / relpath
        source = reader(path, name=name, shown=_shown(path, root),
                        skip_bad_rows=opts.skip_bad_rows)  # fmt: skip
        return _replay(collect(source), opts)

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


def detect_format(path: Path) -> str:
    """Guess a file's format from its name and first bytes; TraceError when it cannot."""
    name = path.name.lower()
    if path.is_dir():
        if any(path.glob("*.traj")):
            return "swe-agent"
        raise TraceError(f"{path}: a directory without .traj files")
    if name.endswith(".traj"):
        return "swe-agent"
    if name.endswith(".parquet"):
        try:
            names = pq.ParquetFile(path).schema_arrow.names
        except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: bad UTF-8
            raise TraceError(f"{path}: cannot read as Parquet: {one_line(exc)}") from None
        return "lmsys" if "conversation" in names and "segments" not in names else "canonical"
    if name.endswith(".json"):
        return "sharegpt"
    if name.endswith(".csv"):
        try:
            with path.open("rb") as handle:
                head = decode_utf8(handle.readline(), str(path), TraceError)
        except OSError as exc:
            raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from None
        if "ContextTokens" in head:
            return "azure"
        if "Request tokens" in head:
            return "burstgpt"
        raise TraceError(f"{path}:1: unknown CSV header; expected Azure or BurstGPT columns")
    if name.endswith((".jsonl", ".jsonl.gz", ".gz")):
        try:
            first = next((raw for _, raw in iter_lines(path, str(path)) if raw.strip()), b"")
            row = parse_json(first) if first else {}
        except ValueError:
            return "mooncake"  # its own reader reports the bad line
        if isinstance(row, dict) and "event" in row:
            return "dynamo"
        own = ("segments", "arrival_s", "output_tokens")  # kvsim JSONL's names, not Mooncake's
        return "jsonl" if isinstance(row, dict) and any(k in row for k in own) else "mooncake"
    raise TraceError(f"{path}: unknown trace format; pass a format ({', '.join(FORMATS)})")


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
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise UnknownNameError("trace format", fmt, list(FORMATS))
    if fmt == "canonical":
        return read_trace(path, skip_bad_rows)
    if fmt == "mooncake":
        return load_mooncake(path, errors=RowErrors(skip=skip_bad_rows))
    if fmt == "jsonl":
        return read_jsonl(path, skip_bad_rows=skip_bad_rows)
    if fmt in ("sharegpt", "lmsys"):
        timing = ChatTiming.default(seed, rate or 1.0)
        reader = read_sharegpt_json if fmt == "sharegpt" else read_lmsys
        return reader(path, counter=make_counter(tokenizer), timing=timing,
                      skip_bad_rows=skip_bad_rows)  # fmt: skip
    if fmt == "swe-agent":
        return read_swe_agent(path, counter=make_counter(tokenizer), skip_bad_rows=skip_bad_rows)
    reader = {"azure": read_azure, "burstgpt": read_burstgpt, "dynamo": read_dynamo}[fmt]
    return reader(path, skip_bad_rows=skip_bad_rows)


# --- options --------------------------------------------------------------------------------------


def _check_options(max_requests: int | None, rate: float | None, rate_scale: float) -> None:
    if max_requests is not None and (isinstance(max_requests, bool) or max_requests < 1):
        raise KvsimError(f"option 'max_requests' must be >= 1, got {max_requests!r}")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise KvsimError(f"option 'rate' must be a positive number, got {rate!r}")
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise KvsimError(f"option 'rate_scale' must be a positive number, got {rate_scale!r}")


def _session_starts(table: pa.Table) -> np.ndarray:
    arrival = table.column("arrival_s").to_numpy()
    _, first = np.unique(table.column("session_id").to_numpy(), return_index=True)
    return np.sort(arrival[first])


class _Scaled:
    """Replay: the trace's own session starts, times `factor` (a process for `retime_table`)."""

    def __init__(self, starts: np.ndarray, factor: float) -> None:
        self._starts, self._factor, self._i = starts, factor, 0

    def draw(self, n: int) -> np.ndarray:
        out = self._starts[self._i : self._i + n] * self._factor
        self._i += n
        return out


def _replay(trace: Trace, opts: _Options) -> Trace:
    """Real timestamps: `rate` stretches session starts to that mean rate, `rate_scale` divides.

    Sessions move as a whole, so think times and turn order stay as they are.
    """
    factor = 1.0 / opts.rate_scale
    if opts.rate is not None:
        starts = _session_starts(trace.table)
        span = float(starts[-1] - starts[0]) if starts.size else 0.0
        if span <= 0:
            raise TraceError(
                f"{trace.name}: all arrivals at one instant; option 'rate' cannot apply"
            )
        factor *= (starts.size / span) / opts.rate
    table = trace.table
    if factor != 1.0:
        starts = _session_starts(table)
        table = retime_table(table, _Scaled(starts - starts[0], factor))
        table = _shift_origin(table, float(starts[0]) * factor)
    if opts.max_requests is not None:
        table = table.slice(0, opts.max_requests)
    return Trace.from_table(table, trace.name)


def _shift_origin(table: pa.Table, offset: float) -> pa.Table:
    if offset == 0:
        return table
    idx = table.schema.get_field_index("arrival_s")
    values = table.column("arrival_s").to_numpy() + offset
    return table.set_column(idx, table.schema.field(idx), pa.array(values, pa.float64()))


def _load_parquet(path: Path, opts: _Options) -> Trace:
    if opts.rate is not None:
        raise KvsimError(
            f"option 'rate' does not apply to a stored trace ({path}); use 'rate_scale'"
        )
    trace = read_trace(path, opts.skip_bad_rows)
    table = trace.table
    if opts.max_requests is not None:
        table = table.slice(0, opts.max_requests)
    if opts.rate_scale != 1.0:
        index = table.schema.get_field_index("arrival_s")
        scaled = np.asarray(table.column("arrival_s").to_numpy()) / opts.rate_scale
        table = table.set_column(index, table.schema.field(index), pa.array(scaled, pa.float64()))
    return Trace.from_table(table, str(path))


def _load_path(path: Path, opts: _Options, fmt: str | None, tokenizer) -> Trace:
    if not exists(path):
        raise TraceError(f"{path}: no such trace file")
    fmt = fmt or detect_format(path)
    if fmt == "canonical":
        return _load_parquet(path, opts)
    if fmt == "mooncake":
        return load_mooncake(path, max_requests=opts.max_requests, rate=opts.rate,
                             rate_scale=opts.rate_scale,
                             errors=RowErrors(skip=opts.skip_bad_rows))  # fmt: skip
    chat = fmt in ("sharegpt", "lmsys")
    source = open_source(
        path,
        format=fmt,
        seed=opts.seed,
        rate=(opts.rate or 1.0) * opts.rate_scale if chat else None,
        tokenizer=tokenizer,
        skip_bad_rows=opts.skip_bad_rows,
    )
    assert isinstance(source, Chunked)
    if chat:  # generated session starts: rate already applied
        return collect(source, opts.max_requests)
    return _replay(collect(source), opts)


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
    opts = _Options(None if retimed else max_requests, None if retimed else rate,
                    1.0 if retimed else rate_scale, seed, skip_bad_rows)  # fmt: skip
    key = os.fspath(name_or_path)
    if key in _LOADERS:
        trace = _LOADERS[key].loader(traces_dir(), opts)
    elif format is not None or Path(key).suffix or exists(Path(key)):
        trace = _load_path(Path(key), opts, format, tokenizer)
    else:
        raise UnknownNameError("trace", key, trace_names())
    if not retimed:
        return trace
    starts = _session_starts(trace.table)
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

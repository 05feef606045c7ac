"""Where a window reads its trace: a slice of it, never the whole.

A window needs the requests of its timed span and, before them, only those its cache-only
warm-up replays (kvsim.engine.warmup.replay_horizon: the latest requests whose blocks fill the
fleet's caches twice). `horizon_start` finds where that horizon begins by reading back from
the window's timed start a step at a time, counting distinct blocks by their hashes; the window
then reads the horizon and what follows it. A trace in memory and a trace file are cut alike,
so they give the same bits.

A canonical Parquet file (`kvsim trace convert` and `kvsim trace synth` write them: sorted by
arrival, request ids numbering the rows) is read in slices. The caller re-times its
closed-loop turns once, streaming it in batches (`stream_retimed`), into a copy whose row
groups' arrival statistics tell a window which row groups to read (`TraceFile.read`). The
caller holds 24 bytes a request (its estimated arrival, service time and (session, turn)
key), never the requests themselves; a worker holds its slice.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import simpy

from kvsim.costmodel import CostModel
from kvsim.engine.assemble import RunParts, assemble
from kvsim.engine.resolve import ResolvedEngine
from kvsim.engine.trace_view import TraceRequests
from kvsim.engine.warmup import horizon_blocks
from kvsim.engine.window import Window
from kvsim.errors import TraceError
from kvsim.shard.retime import follow_chains, service_s
from kvsim.traces import Trace
from kvsim.traces.blocks import table_block_hashes
from kvsim.traces.schema import (
    META_SKIPPED,
    TRACE_SCHEMA,
    check_rows,
    trace_warnings,
    with_hint_columns,
)

#: rows per batch the caller streams, and per row group of the re-timed copy
BATCH_ROWS = 65_536
#: how far back (s) a window first reads before its timed start
FIRST_LOOK_BACK_S = 120.0
#: requests each further step back aims to read (the step in seconds adapts to the rate)
STEP_ROWS = 65_536


class Rows(Protocol):
    """A trace a window can read part of."""

    first_s: float  # the earliest arrival

    def read(self, lo_s: float, hi_s: float) -> tuple[Trace, np.ndarray]:
        """The requests arriving in [lo_s, hi_s), in trace order, and their rows in the whole
        trace."""
        ...


@dataclass
class InMemory:
    """A trace already loaded (a built-in, any format, any arrival model)."""

    trace: Trace

    @property
    def first_s(self) -> float:
        arrival = self.trace.table.column("arrival_s").to_numpy()
        return float(arrival.min()) if arrival.size else 0.0

    def read(self, lo_s: float, hi_s: float) -> tuple[Trace, np.ndarray]:
        arrival = self.trace.table.column("arrival_s").to_numpy()
        rows = np.flatnonzero((arrival >= lo_s) & (arrival < hi_s))
        return _take(self.trace, rows), rows


@dataclass(frozen=True)
class TraceFile:
    """A canonical Parquet trace whose request ids number its rows, read by row groups whose
    arrival statistics overlap the slice asked for. Picklable: a Ray worker opens it at the
    same path (on a cluster the folder must be shared)."""

    path: str
    first_s: float

    def read(self, lo_s: float, hi_s: float) -> tuple[Trace, np.ndarray]:
        file = pq.ParquetFile(self.path)
        column = file.schema_arrow.get_field_index("arrival_s")
        groups = []
        for g in range(file.metadata.num_row_groups):
            stats = file.metadata.row_group(g).column(column).statistics
            if stats is None or not stats.has_min_max or (stats.max >= lo_s and stats.min < hi_s):
                groups.append(g)
        table = file.read_row_groups(groups) if groups else file.schema_arrow.empty_table()
        table = with_hint_columns(table)
        table = table.select([f.name for f in TRACE_SCHEMA])
        table = table.cast(TRACE_SCHEMA.with_metadata(file.schema_arrow.metadata))
        arrival = table.column("arrival_s").to_numpy()
        keep = np.flatnonzero((arrival >= lo_s) & (arrival < hi_s))
        if keep.size < table.num_rows:
            table = table.take(pa.array(keep))
        trace = Trace.from_table(table, self.path)
        return trace, table.column("request_id").to_numpy()


def _take(trace: Trace, rows: np.ndarray) -> Trace:
    if rows.size == trace.table.num_rows:
        return trace
    return Trace(trace.table.take(pa.array(rows)), trace.name, trace.native_block_size,
                 trace.description, trace.skipped_rows, trace.warnings)  # fmt: skip


def fleet_horizon_blocks(run: ResolvedEngine, trace: Trace) -> int:
    """Distinct blocks the warm-up's horizon reaches (kvsim.engine.warmup.horizon_blocks),
    from a fleet built and dropped."""
    env = simpy.Environment()
    source = TraceRequests(trace, run.config.block_size)
    fleet = assemble(RunParts.build(env, run, source), lambda _req: None)
    return horizon_blocks(fleet)


def window_trace(rows: Rows, window: Window, run: ResolvedEngine) -> tuple[Trace, np.ndarray]:
    """The part of the trace `window` runs on (the warm-up's horizon, the timed span and the
    next window's warm-up), and its rows in the whole trace."""
    start, until = window.timed_from_s, window.served_until_s
    lo = -math.inf
    if math.isfinite(start) and start > rows.first_s:
        lo = horizon_start(rows, start, run)
    return rows.read(lo, until)


def horizon_start(rows: Rows, start_s: float, run: ResolvedEngine) -> float:
    """The arrival of the earliest request the cache-only warm-up replays before `start_s`
    (kvsim.engine.warmup.replay_horizon: the latest requests whose distinct blocks reach
    `horizon_blocks`), or -inf when it replays every earlier one.

    Reads back a step at a time (about `STEP_ROWS` requests) and keeps only the sorted 64-bit
    hashes of the blocks it has seen, so a window that reaches back millions of requests holds
    one step's requests and a word per distinct block, not the whole horizon's chains."""
    block_size = run.config.block_size
    target: float | None = None
    seen = np.zeros(0, dtype=np.uint64)
    distinct = 0
    hi, step = start_s, FIRST_LOOK_BACK_S
    while True:
        lo = hi - step if hi - step > rows.first_s else -math.inf
        trace, _ = rows.read(lo, hi)
        table = trace.table
        if table.num_rows:
            if target is None:
                target = fleet_horizon_blocks(run, trace)
            arrival = table.column("arrival_s").to_numpy()
            order = np.argsort(-arrival, kind="stable")  # latest first, as replay_horizon
            stream, ends, lengths = _chains(table, order, block_size)
            if stream.size:
                # sorted distinct hashes, each where it first appears; those seen in a later
                # step dropped (sorted keys: each search starts where the last one ended)
                new, first_at = np.unique(stream, return_index=True)
                if seen.size:
                    at = np.minimum(np.searchsorted(seen, new), seen.size - 1)
                    fresh = seen[at] != new
                    new, first_at = new[fresh], first_at[fresh]
                first = np.zeros(stream.size, dtype=bool)
                first[first_at] = True
                counts = distinct + np.cumsum(first)[ends - 1]
                enough = np.flatnonzero((counts >= target) & (lengths > 0))
                if enough.size:
                    return float(arrival[order[enough[0]]])
                distinct = int(counts[-1])
                seen = np.insert(seen, np.searchsorted(seen, new), new)
        if lo == -math.inf:
            return -math.inf
        step *= min(max(STEP_ROWS / max(table.num_rows, 1), 0.5), 4.0)
        hi = lo


def _chains(table: pa.Table, order: np.ndarray, block_size: int):
    """(the block hashes of the rows in `order`, one chain after another; each chain's end
    in that stream; each chain's length)."""
    offsets, hashes = table_block_hashes(table, block_size)
    lengths = offsets[order + 1] - offsets[order]
    ends = np.cumsum(lengths)
    if not ends.size or not ends[-1]:
        return hashes[:0], ends, lengths
    starts = np.repeat(offsets[order] - (ends - lengths), lengths)
    return hashes[starts + np.arange(ends[-1])], ends, lengths


@dataclass
class Retimed:
    """A trace file re-timed for cutting: each request's estimated arrival (in row order), the
    copy windows read, and what the run's summary says of the trace."""

    arrival_s: np.ndarray
    file: TraceFile
    skipped_rows: int
    warnings: tuple[str, ...]
    folder: tempfile.TemporaryDirectory

    def close(self) -> None:
        self.folder.cleanup()


def streamable(path: str, options: dict) -> bool:
    """Whether a run's trace can be read in slices: a canonical Parquet file, loaded as it is
    stored (no rate, arrival model or skipping; a request cap is fine)."""
    from kvsim.traces.formats import detect_format

    p = Path(path)
    if not p.is_file() or p.suffix != ".parquet":
        return False
    stored = options.get("format") in (None, "canonical") and options.get("rate") is None
    stored = stored and options.get("rate_scale", 1.0) == 1.0 and options.get("arrival") is None
    return stored and not options.get("skip_bad_rows") and detect_format(p) == "canonical"


class _NotInSlices(Exception):
    """The file breaks what reading it in slices assumes; it is loaded whole instead."""


class _Retimer:
    """Re-times batches of rows in file order: what a batch's closed-loop turns need of the
    rows before it is kept by row (estimate, service time, packed (session, turn))."""

    def __init__(self, n: int, cost: CostModel, chunk: int) -> None:
        self.cost, self.chunk = cost, chunk
        self.estimate = np.empty(n)
        self.service = np.empty(n)
        self.keys = np.empty(n, dtype=np.int64)
        self.done = 0
        self.last_s = -math.inf

    def batch(self, table: pa.Table) -> np.ndarray:
        """The batch's estimated arrivals (it must follow the rows already given)."""
        rows = np.arange(self.done, self.done + table.num_rows)
        arrival = table.column("arrival_s").to_numpy()
        ids = table.column("request_id").to_numpy()
        if not np.array_equal(ids, rows):
            raise _NotInSlices("request ids do not number the rows")
        if arrival[0] < self.last_s or np.any(np.diff(arrival) < 0):
            raise _NotInSlices("rows not sorted by arrival")
        session = table.column("session_id").to_numpy()
        turn = table.column("turn").to_numpy().astype(np.int64)
        if session.min() < 0 or session.max() >= 1 << 32:
            raise _NotInSlices("session ids do not pack")
        self.keys[rows] = (session << 31) | turn
        think = table.column("think_time_s")
        closed = think.is_valid().to_numpy(zero_copy_only=False) & (turn > 0)
        parent = table.column("parent_id").to_numpy()
        prev = np.where(closed & (parent >= 0) & (parent < rows), parent, -1)
        chained = prev >= 0
        chained[chained] = self.keys[prev[chained]] == self.keys[rows[chained]] - 1
        if np.any(closed & ~chained):
            raise _NotInSlices("a closed-loop turn does not name the turn before it as parent")
        inputs = table.column("input_tokens").to_numpy()
        outputs = table.column("output_tokens").to_numpy()
        self.service[rows] = service_s(self.cost, inputs, outputs, self.chunk)
        self.estimate[rows] = arrival
        think_s = think.fill_null(0.0).to_numpy()
        follow_chains(self.estimate, self.service, rows, np.where(chained, prev, -1), think_s, turn)
        self.done += rows.size
        self.last_s = float(arrival[-1])
        return self.estimate[rows]


def stream_retimed(
    path: str, cost: CostModel, chunk: int, max_requests: int | None = None
) -> Retimed | None:
    """`path` (its first `max_requests` rows) re-timed as `kvsim.shard.retime.retimed`
    re-times a loaded trace, streamed in batches into a temporary copy. None when the file's
    request ids do not number its rows in arrival order, or a closed-loop turn does not name
    the turn before it as parent: such a file is loaded whole."""
    file = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering keeps every batch it read
    n = (
        file.metadata.num_rows
        if max_requests is None
        else min(file.metadata.num_rows, max_requests)
    )
    meta = file.schema_arrow.metadata or {}
    schema = TRACE_SCHEMA.with_metadata(meta)
    retimer = _Retimer(n, cost, chunk)
    folder = tempfile.TemporaryDirectory(prefix="kvsim-shard-")
    out = Path(folder.name) / "retimed.parquet"
    try:
        with pq.ParquetWriter(out, schema) as writer:
            for batch in file.iter_batches(batch_size=BATCH_ROWS):
                table = pa.Table.from_batches([batch]).slice(0, n - retimer.done)
                if not table.num_rows:
                    break
                table = with_hint_columns(table).select(schema.names).cast(schema)
                check_rows(table, path, retimer.done)
                column = schema.get_field_index("arrival_s")
                new = pa.array(retimer.batch(table))
                writer.write_table(table.set_column(column, schema.field(column), new))
    except _NotInSlices:
        folder.cleanup()
        return None
    except BaseException:
        folder.cleanup()
        raise
    if retimer.done == 0:
        folder.cleanup()
        raise TraceError(f"{path}: no requests")
    times = pq.read_table(path, columns=["arrival_s", "think_time_s"]).slice(0, retimer.done)
    name = meta.get(b"kvsim.trace_name", b"").decode()
    warnings = trace_warnings(times, name or path)
    skipped = int(meta.get(META_SKIPPED, b"0") or 0)
    first = float(retimer.estimate.min())
    return Retimed(retimer.estimate, TraceFile(str(out), first), skipped, warnings, folder)

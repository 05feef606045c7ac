"""The canonical trace: one Arrow table, one row per request, whatever the source format.

Every loader produces this table and the engine reads only this table, so a new source format is a
new loader and nothing else. Columns (sorted by `arrival_s`, then `request_id`):

- `request_id` int64, unique; `session_id` int64; `turn` int32, 0-based within the session.
- `arrival_s` float64: nominal arrival, seconds from trace start (always filled).
- `think_time_s` float64, nullable: when set and `turn` > 0, the request is issued this long after
  the previous turn of its session finished (closed loop); when null it arrives at `arrival_s`.
- `input_tokens` int32 (>= 1: a request needs a prompt), `output_tokens` int32 (>= 1); neither
  above `MAX_REQUEST_TOKENS`.
- `segments` list<struct<hash uint64, tokens int32, kind string>>: the prompt as content-addressed
  pieces, `sum(tokens) == input_tokens`, each `tokens >= 1`, `kind` in `SEGMENT_KINDS`.
- `output_hash` uint64: content hash of the reply (0: not content-addressed).

Request hints: what a serving system knows about a request beyond its tokens (issue 23; policies
see them as `kvsim.policies.base.RequestHint`). Files written before they existed load with the
defaults.

- `parent_id` int64: the `request_id` of the call this request follows (the previous turn of its
  session, or the agent call that spawned a subagent); -1 = none or unknown. A parent outside the
  table (a slice of a longer trace) is allowed.
- `category` string: the request's kind as the source labels it: 'chat', 'api', 'agent', or a
  source's own labels such as qwen-bailian's 'text', 'search', 'image', 'file'; '' = unknown.
- `tool_wait_s` float64, nullable: null = the reply is not a tool call (or it is not known);
  >= 0 = the reply is a tool call whose result is expected back in about this long (0 = the
  duration is unknown). Never the observed gap to the next turn, which would show policies the
  future: a generator puts its tool-latency mean, a recorded trace 0. It describes the reply, so
  it is known once the reply is decoded, not at arrival.

Schema metadata: `kvsim.trace_name`, `kvsim.native_block_size` (absent when the source has none),
`kvsim.description` (one line on what is real and what is drawn), `kvsim.skipped_rows` (malformed
source rows left out under `skip_bad_rows`; absent when none).

`Trace.warnings` holds plausibility warnings that do not stop a run, such as arrivals that reach
past `IMPLAUSIBLE_SPAN_S` (30 days), which almost always means milliseconds or epoch times were
read as seconds. They are computed from the table whenever a `Trace` is built, so every loader
and every retiming gets them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvsim.errors import TraceError
from kvsim.textio import one_line

__all__ = [
    "HINT_COLUMNS",
    "IMPLAUSIBLE_SPAN_S",
    "KIND_CODES",
    "MAX_CATEGORY_CHARS",
    "MAX_REQUEST_TOKENS",
    "SEGMENT_KINDS",
    "SEGMENT_TYPE",
    "TRACE_SCHEMA",
    "SegmentColumns",
    "Trace",
    "check_rows",
    "drop_bad_rows",
    "make_trace_table",
    "read_trace",
    "segment_columns",
    "trace_warnings",
    "validate_trace",
    "with_hint_columns",
    "write_trace",
]

#: Most tokens one request may have in its prompt or its reply. The longest context windows
#: served today are about 10^7 tokens; 10^8 leaves room for any real trace while catching the
#: counts that are really bytes, ids or corrupt cells (and stays far inside int32).
MAX_REQUEST_TOKENS = 100_000_000
#: Longest `category` label a loader accepts: labels are short names ('chat', 'search'); a long
#: one is a misplaced field, and one per row in a fixed-width array would cost memory.
MAX_CATEGORY_CHARS = 64
#: Arrivals past this (30 days) are almost surely in the wrong unit: `Trace.warnings` says so.
IMPLAUSIBLE_SPAN_S = 30 * 86_400.0

SEGMENT_KINDS = ("system", "user", "assistant", "tool", "document", "opaque")
KIND_CODES = {kind: code for code, kind in enumerate(SEGMENT_KINDS)}

META_NAME = b"kvsim.trace_name"
META_BLOCK = b"kvsim.native_block_size"
META_DESCRIPTION = b"kvsim.description"
META_SKIPPED = b"kvsim.skipped_rows"

SEGMENT_TYPE = pa.struct(
    [
        pa.field("hash", pa.uint64(), nullable=False),
        pa.field("tokens", pa.int32(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
    ]
)

TRACE_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.int64(), nullable=False),
        pa.field("session_id", pa.int64(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("arrival_s", pa.float64(), nullable=False),
        pa.field("think_time_s", pa.float64(), nullable=True),
        pa.field("input_tokens", pa.int32(), nullable=False),
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("segments", pa.list_(SEGMENT_TYPE), nullable=False),
        pa.field("output_hash", pa.uint64(), nullable=False),
        pa.field("parent_id", pa.int64(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("tool_wait_s", pa.float64(), nullable=True),
    ]
)
#: The request-hint columns: optional on input (older files lack them), filled with defaults.
HINT_COLUMNS = ("parent_id", "category", "tool_wait_s")


@dataclass(frozen=True)
class Trace:
    """A canonical trace table with its metadata unpacked for convenience."""

    table: pa.Table
    name: str
    native_block_size: int | None
    description: str
    skipped_rows: int = 0  # malformed source rows left out under skip_bad_rows
    warnings: tuple[str, ...] = ()  # plausibility warnings for the user (see `trace_warnings`)

    def __len__(self) -> int:
        return self.table.num_rows

    @classmethod
    def from_table(cls, table: pa.Table, source: str = "trace") -> Trace:
        table = with_hint_columns(table)
        meta = table.schema.metadata or {}
        block = _meta_int(meta, META_BLOCK, source, low=1)
        name = _meta_text(meta, META_NAME, source)
        return cls(
            table=table,
            name=name,
            native_block_size=block,
            description=_meta_text(meta, META_DESCRIPTION, source),
            skipped_rows=_meta_int(meta, META_SKIPPED, source, low=0) or 0,
            warnings=trace_warnings(table, name or source),
        )


def _meta_int(meta: dict[bytes, bytes], key: bytes, source: str, low: int) -> int | None:
    """An integer metadata value in [low, 2^31), None when absent or empty; else a TraceError
    (a file written by another tool may hold anything there)."""
    raw = meta.get(key)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value < 2**31:
        raise TraceError(
            f"{source}: metadata {key.decode()!r}: expected an integer >= {low}, got {raw[:40]!r}"
        )
    return value


def _meta_text(meta: dict[bytes, bytes], key: bytes, source: str) -> str:
    raw = meta.get(key, b"")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{source}: metadata {key.decode()!r}: not UTF-8 text") from None


def trace_warnings(table: pa.Table, source: str) -> tuple[str, ...]:
    """Warnings about times that are valid but implausible: a unit mistake, not a workload.

    A trace whose arrivals (or one think time) reach past 30 days would make the simulator walk
    through months of idle time; the usual cause is epoch or millisecond timestamps read as
    seconds, so the message says that.
    """
    if table.num_rows == 0:
        return ()
    found = []
    days = IMPLAUSIBLE_SPAN_S / 86_400
    arrival = pc.max(table.column("arrival_s")).as_py()
    if arrival is not None and arrival > IMPLAUSIBLE_SPAN_S:
        found.append(
            f"{source}: the last request arrives {arrival:.4g} s ({arrival / 86_400:,.0f} days) "
            f"after the trace starts, over {days:.0f} days; the time unit looks wrong "
            "(milliseconds or epoch timestamps read as seconds?)"
        )
    think = pc.max(table.column("think_time_s")).as_py()
    if think is not None and think > IMPLAUSIBLE_SPAN_S:
        found.append(
            f"{source}: a think time of {think:.4g} s ({think / 86_400:,.0f} days), over "
            f"{days:.0f} days; the time unit looks wrong (milliseconds read as seconds?)"
        )
    return tuple(found)


@dataclass(frozen=True)
class SegmentColumns:
    """The segments column as flat numpy arrays: row i owns `offsets[i]:offsets[i+1]`."""

    offsets: np.ndarray  # int64, rows + 1
    hashes: np.ndarray  # uint64
    tokens: np.ndarray  # int64
    kinds: np.ndarray  # uint8 codes into SEGMENT_KINDS


def _metadata(name: str, native_block_size: int | None, description: str) -> dict[bytes, bytes]:
    meta = {META_NAME: name.encode(), META_DESCRIPTION: description.encode()}
    if native_block_size is not None:
        meta[META_BLOCK] = str(int(native_block_size)).encode()
    return meta


def with_hint_columns(table: pa.Table) -> pa.Table:
    """`table` with each missing hint column appended, filled with its default (-1, '', null).

    Why: a file written before the hint columns existed must still load and replay the same.
    """
    n = table.num_rows
    defaults = {
        "parent_id": lambda: pa.array(np.full(n, -1, np.int64), pa.int64()),
        "category": lambda: _categories("", n),
        "tool_wait_s": lambda: pa.nulls(n, pa.float64()),
    }
    for name in HINT_COLUMNS:
        if name not in table.schema.names:
            table = table.append_column(TRACE_SCHEMA.field(name), defaults[name]())
    return table


def _categories(category: str | np.ndarray | list[str] | None, n: int) -> pa.Array:
    """The `category` column from one label for every row or one per row (None: '')."""
    if category is None or isinstance(category, str):
        label = category or ""
        return pc.take(pa.array([label], pa.string()), pa.array(np.zeros(n, np.int32)))
    values = np.asarray(category, dtype=str)
    if values.size != n:
        raise ValueError(f"category: expected {n} labels, got {values.size}")
    if n and (values == values[0]).all():  # the usual case: one label for a whole source
        return _categories(str(values[0]), n)
    labels, codes = np.unique(values, return_inverse=True)
    return pc.take(pa.array(labels.tolist(), pa.string()), pa.array(codes.astype(np.int64)))


def _nullable_seconds(values: np.ndarray | None, n: int) -> pa.Array:
    """A float64 column with NaN as null (None: all null)."""
    if values is None:
        return pa.nulls(n, pa.float64())
    arr = np.asarray(values, dtype=np.float64)
    return pa.array(arr, mask=np.isnan(arr), type=pa.float64())


def make_trace_table(
    *,
    request_id: np.ndarray,
    session_id: np.ndarray,
    turn: np.ndarray,
    arrival_s: np.ndarray,
    think_time_s: np.ndarray | None,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    seg_offsets: np.ndarray,
    seg_hashes: np.ndarray,
    seg_tokens: np.ndarray,
    seg_kinds: np.ndarray,
    output_hash: np.ndarray,
    name: str,
    native_block_size: int | None,
    description: str,
    parent_id: np.ndarray | None = None,
    category: str | np.ndarray | list[str] | None = None,
    tool_wait_s: np.ndarray | None = None,
) -> pa.Table:
    """Build a canonical table from flat columns, sorted by (arrival_s, request_id).

    `think_time_s` and `tool_wait_s` may be None (all null) or a float array with NaN for null.
    `parent_id` None means -1 (none) for every row; `category` is one label for every row or one
    per row (None: ''). Segments arrive flat with offsets, so no per-row Python object is built.
    """
    n = len(request_id)
    _check_token_counts(name, input_tokens, output_tokens, seg_tokens, seg_offsets)
    think = _nullable_seconds(think_time_s, n)
    parent = np.full(n, -1, np.int64) if parent_id is None else parent_id
    kinds = pc.take(pa.array(SEGMENT_KINDS, pa.string()), pa.array(seg_kinds, pa.uint8()))
    values = pa.StructArray.from_arrays(
        [pa.array(seg_hashes, pa.uint64()), pa.array(seg_tokens, pa.int32()), kinds],
        fields=list(SEGMENT_TYPE),
    )
    segments = pa.ListArray.from_arrays(pa.array(seg_offsets, pa.int32()), values)
    columns = [
        pa.array(request_id, pa.int64()),
        pa.array(session_id, pa.int64()),
        pa.array(turn, pa.int32()),
        pa.array(arrival_s, pa.float64()),
        think,
        pa.array(input_tokens, pa.int32()),
        pa.array(output_tokens, pa.int32()),
        segments.cast(pa.list_(SEGMENT_TYPE)),
        pa.array(output_hash, pa.uint64()),
        pa.array(parent, pa.int64()),
        _categories(category, n),
        _nullable_seconds(tool_wait_s, n),
    ]
    schema = TRACE_SCHEMA.with_metadata(_metadata(name, native_block_size, description))
    table = pa.Table.from_arrays(columns, schema=schema)
    order = np.lexsort((np.asarray(request_id), np.asarray(arrival_s)))
    if not np.array_equal(order, np.arange(n)):
        table = table.take(pa.array(order))
    return table


def _check_token_counts(
    name: str,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    seg_tokens: np.ndarray,
    seg_offsets: np.ndarray,
) -> None:
    """Last line of defence before int32 columns: an implausible count is a TraceError naming the
    request, never a pyarrow overflow. Loaders check first, naming the source line."""
    for field, values in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        values = np.asarray(values)
        if values.size and values.max() > MAX_REQUEST_TOKENS:
            row = int(np.argmax(values > MAX_REQUEST_TOKENS))
            raise TraceError(
                f"{name}: request {row}: field {field!r}: {int(values[row]):,} tokens is "
                f"implausible (at most {MAX_REQUEST_TOKENS:,} per request)"
            )
    seg = np.asarray(seg_tokens)
    if seg.size and seg.max() > MAX_REQUEST_TOKENS:
        i = int(np.argmax(seg > MAX_REQUEST_TOKENS))
        row = int(np.searchsorted(np.asarray(seg_offsets), i, side="right")) - 1
        raise TraceError(
            f"{name}: request {row}: field 'segments': {int(seg[i]):,} tokens is implausible "
            f"(at most {MAX_REQUEST_TOKENS:,} per request)"
        )


def segment_columns(table: pa.Table) -> SegmentColumns:
    """Flatten the segments column into numpy arrays (what the engine's hot path wants),
    viewing Arrow's buffers where the types agree (a window's slice: 60 MiB of hashes)."""
    column = table.column("segments")
    if column.num_chunks == 1:  # combining would copy it
        lists = column.chunk(0)
    else:
        lists = column.combine_chunks()
        if isinstance(lists, pa.ChunkedArray):  # zero chunks
            lists = pa.array([], pa.list_(SEGMENT_TYPE))
    offsets = lists.offsets.to_numpy().astype(np.int64)
    flat = lists.flatten()
    offsets = offsets - offsets[0]
    kinds = pc.index_in(flat.field("kind"), value_set=pa.array(SEGMENT_KINDS))
    return SegmentColumns(
        offsets=offsets,
        hashes=flat.field("hash").to_numpy(zero_copy_only=False).astype(np.uint64, copy=False),
        tokens=flat.field("tokens").to_numpy(zero_copy_only=False).astype(np.int64),
        kinds=kinds.fill_null(255).to_numpy(zero_copy_only=False).astype(np.uint8),
    )


def _fail(source: str, row: int, field: str, message: str) -> None:
    raise TraceError(f"{source}: row {row}: field {field!r}: {message}")


def _np(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


def _check_columns(table: pa.Table, source: str) -> None:
    """Every canonical column is present (hint columns may be missing: `with_hint_columns`
    fills them), of its type, and null only where allowed."""
    names = table.schema.names
    for field in TRACE_SCHEMA:
        if field.name not in names:
            if field.name in HINT_COLUMNS:  # written before hints existed: defaults apply
                continue
            raise TraceError(f"{source}: field {field.name!r}: missing column")
        if names.count(field.name) > 1:
            raise TraceError(f"{source}: field {field.name!r}: appears {names.count(field.name)} "
                             "times")  # fmt: skip
        actual = table.schema.field(field.name).type
        if not actual.equals(field.type):
            raise TraceError(
                f"{source}: field {field.name!r}: expected type {field.type}, got {actual}"
            )
        column = table.column(field.name)
        if not field.nullable and column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            _fail(source, row, field.name, "is null")


def _row_problems(table: pa.Table) -> tuple[np.ndarray, list[tuple[int, str, str]]]:
    """Rows that are wrong on their own (a bad count, time or segment), whatever other rows hold.

    Returns the mask of bad rows and, per failed check, its first row with field and message.
    """
    n = table.num_rows
    bad = np.zeros(n, bool)
    firsts: list[tuple[int, str, str]] = []

    def check(mask: np.ndarray, field: str, message: str, values: np.ndarray | None) -> None:
        if mask.any():
            row = int(np.flatnonzero(mask)[0])
            value = None if values is None else values[row]
            value = (
                value.item() if isinstance(value, np.generic) else value
            )  # 2.0, not np.float64(2.0)
            got = "" if values is None else f", got {value!r}"
            firsts.append((row, field, message + got))
            bad[mask] = True

    arrival = _np(table, "arrival_s")
    turn = _np(table, "turn")
    inputs = _np(table, "input_tokens")
    outputs = _np(table, "output_tokens")
    think = table.column("think_time_s").to_numpy(zero_copy_only=False)
    check(~np.isfinite(arrival) | (arrival < 0), "arrival_s", "expected finite >= 0", arrival)
    check(
        (~np.isnan(think) & ~(think >= 0)) | np.isinf(think),
        "think_time_s",
        "expected finite >= 0",
        think,
    )
    check(turn < 0, "turn", "expected >= 0", turn)
    if "parent_id" in table.schema.names:
        parent = _np(table, "parent_id")
        check(parent < -1, "parent_id", "expected a request id or -1 (none)", parent)
        check(
            parent == _np(table, "request_id"),
            "parent_id",
            "expected another request's id (a request cannot follow itself)",
            parent,
        )
    if "tool_wait_s" in table.schema.names:
        wait = table.column("tool_wait_s").to_numpy(zero_copy_only=False)
        check(
            (~np.isnan(wait) & ~(wait >= 0)) | np.isinf(wait),
            "tool_wait_s",
            "expected null or finite >= 0",
            wait,
        )
    check(inputs < 1, "input_tokens", "expected >= 1 (a request needs a prompt)", inputs)
    check(
        inputs > MAX_REQUEST_TOKENS,
        "input_tokens",
        f"expected at most {MAX_REQUEST_TOKENS:,} (implausible)",
        inputs,
    )
    check(outputs < 1, "output_tokens", "expected >= 1", outputs)
    check(
        outputs > MAX_REQUEST_TOKENS,
        "output_tokens",
        f"expected at most {MAX_REQUEST_TOKENS:,} (implausible)",
        outputs,
    )

    seg = segment_columns(table)
    row_of_seg = np.repeat(np.arange(n), np.diff(seg.offsets))
    bad_tok = seg.tokens < 1
    if bad_tok.any():
        i = int(np.flatnonzero(bad_tok)[0])
        firsts.append(
            (
                int(row_of_seg[i]),
                "segments",
                f"segment tokens must be >= 1, got {int(seg.tokens[i])}",
            )
        )
        bad[row_of_seg[bad_tok]] = True
    bad_kind = seg.kinds == 255
    if bad_kind.any():
        i = int(np.flatnonzero(bad_kind)[0])
        kind = table.column("segments").combine_chunks().flatten().field("kind")[i].as_py()
        firsts.append(
            (
                int(row_of_seg[i]),
                "segments",
                f"kind must be one of {', '.join(SEGMENT_KINDS)}, got {kind!r}",
            )
        )
        bad[row_of_seg[bad_kind]] = True
    running = np.concatenate(([0], np.cumsum(seg.tokens)))
    totals = running[seg.offsets[1:]] - running[seg.offsets[:-1]]
    check(
        totals != inputs,
        "input_tokens",
        "expected the sum of segment tokens (mismatch)",
        inputs,
    )
    return bad, firsts


def _turn_positions(session: np.ndarray) -> np.ndarray:
    """Each row's place among its session's rows, in table order (what `turn` must equal)."""
    order = np.lexsort((np.arange(session.size), session))
    s_sorted = session[order]
    starts = np.concatenate(([True], s_sorted[1:] != s_sorted[:-1]))
    group_start = np.maximum.accumulate(np.where(starts, np.arange(order.size), 0))
    expected = np.empty_like(order)
    expected[order] = np.arange(order.size) - group_start
    return expected


def check_rows(table: pa.Table, source: str, first_row: int = 0) -> None:
    """The checks of `validate_trace` that hold row by row (columns, counts, times, segments),
    for a batch of a file read in batches: rows are named from `first_row`. What needs the
    whole table (order, unique ids, turns in order) is the reader's to check."""
    _check_columns(table, source)
    if table.num_rows == 0:
        return
    _, firsts = _row_problems(table)
    if firsts:
        row, field, message = min(firsts, key=lambda f: f[0])
        _fail(source, first_row + row, field, message)


def validate_trace(table: pa.Table, source: str) -> None:
    """Check a table against the canonical schema and invariants; TraceError names row and field.

    Of the rows that are wrong on their own, the earliest is reported.
    """
    check_rows(table, source)
    if table.num_rows == 0:
        return

    request_id = _np(table, "request_id")
    arrival = _np(table, "arrival_s")
    turn = _np(table, "turn")
    later = (arrival[1:] < arrival[:-1]) | (
        (arrival[1:] == arrival[:-1]) & (request_id[1:] <= request_id[:-1])
    )
    if later.any():
        row = int(np.flatnonzero(later)[0]) + 1
        _fail(
            source,
            row,
            "arrival_s",
            "rows not sorted by (arrival_s, request_id) or request_id repeated, "
            f"got {arrival[row]!r}",
        )
    uniq = np.unique(request_id)
    if uniq.size != request_id.size:
        _, first = np.unique(request_id, return_index=True)
        dup = np.ones(request_id.size, bool)
        dup[first] = False
        row = int(np.flatnonzero(dup)[0])
        _fail(source, row, "request_id", f"expected unique, got {request_id[row]!r}")
    # Within each session, turns appear in table order as 0, 1, 2, ... (no turn without its past).
    wrong = turn != _turn_positions(_np(table, "session_id"))
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        _fail(
            source,
            row,
            "turn",
            f"expected the turns of a session in order from 0, got {turn[row]!r}",
        )


def drop_bad_rows(table: pa.Table, source: str) -> tuple[pa.Table, int]:
    """The table without the rows that are wrong on their own, and how many were dropped.

    For `skip_bad_rows` on a canonical file. A session that lost a row has its later turns
    renumbered, so the rest of it still replays (its prompts keep their segments, so the KV they
    would have reused is simply missing), and a request whose parent was dropped has parent -1.
    Problems of the whole file still raise. Missing hint columns come back with their defaults.
    """
    _check_columns(table, source)
    table = with_hint_columns(table)
    if table.num_rows == 0:
        return table, 0
    bad, _ = _row_problems(table)
    if not bad.any():
        return table, 0
    session = _np(table, "session_id")
    hit = np.isin(session, session[bad])
    orphan = np.isin(_np(table, "parent_id"), _np(table, "request_id")[bad])[~bad]
    table = table.filter(pa.array(~bad))
    if orphan.any():
        parent = np.where(orphan, -1, _np(table, "parent_id"))
        index = table.schema.get_field_index("parent_id")
        table = table.set_column(index, table.schema.field(index), pa.array(parent, pa.int64()))
    hit = hit[~bad]
    if hit.any():
        turn = _np(table, "turn").copy()
        turn[hit] = _turn_positions(_np(table, "session_id"))[hit]
        index = table.schema.get_field_index("turn")
        table = table.set_column(index, table.schema.field(index), pa.array(turn, pa.int32()))
    return table, int(bad.sum())


def write_trace(trace: Trace | pa.Table, path: str | Path) -> None:
    """Write a canonical trace to Parquet, metadata included."""
    table = trace.table if isinstance(trace, Trace) else trace
    pq.write_table(table, Path(path))


def read_trace(
    path: str | Path, skip_bad_rows: bool = False, first_rows: int | None = None
) -> Trace:
    """Read and validate a canonical trace written by `write_trace`.

    With `skip_bad_rows`, rows wrong on their own are dropped and counted (`drop_bad_rows`),
    added to any count the file already carries from its conversion. A file written before the
    hint columns existed gets their defaults (`with_hint_columns`). `first_rows` reads only the
    row groups that hold the first N rows (without `skip_bad_rows`, which must see every row to
    count N good ones) and returns those N rows: the first hour of a day's file reads an hour,
    not the day, and only the rows kept are checked, wherever the row groups end.
    """
    path = Path(path)
    try:
        file = pq.ParquetFile(path)
        groups = range(file.metadata.num_row_groups)
        if first_rows is not None and not skip_bad_rows:
            held = np.cumsum([file.metadata.row_group(g).num_rows for g in groups])
            groups = range(int(np.searchsorted(held, first_rows)) + 1)[: len(groups)]
        table = file.read_row_groups(list(groups))
        if first_rows is not None and not skip_bad_rows:
            table = table.slice(0, first_rows)
        table.validate(full=True)  # a damaged page (bad UTF-8, bad offsets) stops here
    except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: bad UTF-8
        raise TraceError(f"{path}: cannot read as Parquet: {one_line(exc)}") from None
    _check_columns(table, str(path))  # a hint column of the wrong type fails before filling
    table = with_hint_columns(table)
    if skip_bad_rows:
        table, dropped = drop_bad_rows(table, str(path))
        if dropped:
            meta = dict(table.schema.metadata or {})
            before = _meta_int(meta, META_SKIPPED, str(path), low=0) or 0
            meta[META_SKIPPED] = str(before + dropped).encode()
            table = table.replace_schema_metadata(meta)
    validate_trace(table, str(path))
    if table.num_rows == 0:  # as every other loader: a trace without requests is an error
        skipped = _meta_int(table.schema.metadata or {}, META_SKIPPED, str(path), low=0)
        reason = f": all {skipped:,} rows were malformed and skipped" if skipped else ""
        raise TraceError(f"{path}: no requests{reason}")
    # Canonical column order (a tool may write them in any order, or add its own columns), and
    # Parquet renames the list item field ("item" -> "element"): restore the canonical schema.
    table = table.select([f.name for f in TRACE_SCHEMA])
    table = table.cast(TRACE_SCHEMA.with_metadata(table.schema.metadata))
    return Trace.from_table(table, str(path))

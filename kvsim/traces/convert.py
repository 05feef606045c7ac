"""Any source → canonical Parquet, streaming: rows are written in arrival order as they settle.

A chunk's rows earlier than the source's frontier can no longer be preceded by anything still to
come, so they are sorted and written; the rest wait for the next chunk. Memory stays at about one
chunk plus the sessions still in progress. Request ids are assigned in write order, which is the
canonical (arrival, session, turn) order, so the file reads back exactly as `load_trace` builds it.
A row written before its children keeps its id in a small index until the last pending row that
names it as parent is written, so `parent_id` resolves across writes without holding the trace.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from kvsim.atomic import check_writable, write_file
from kvsim.errors import KvsimError
from kvsim.traces.common import Chunked, RequestIds, Requests
from kvsim.traces.schema import (
    META_SKIPPED,
    TRACE_SCHEMA,
    Trace,
    _metadata,
    trace_warnings,
    write_trace,
)

__all__ = ["convert_to_parquet", "read_trace_warnings"]


def convert_to_parquet(
    source: Chunked | Trace, out: str | Path, *, max_requests: int | None = None
) -> tuple[int, int]:
    """Write `source` as a canonical Parquet file; returns (requests written, rows skipped).

    `max_requests` keeps the first N requests in canonical order (as `load_trace` does), and
    stops reading the source once they are written.

    An output path that cannot be written (a missing folder, no permission) is a one-line
    KvsimError, checked before any source row is read. The file is written beside `out` and
    renamed onto it when complete (`kvsim.atomic.write_file`): a failed or killed conversion
    leaves any earlier `out` as it was, and no half-written file under its name.
    """
    out = Path(out)
    if not out.parent.is_dir():
        raise KvsimError(f"{out}: folder {out.parent} does not exist; create it first")
    if out.is_dir():
        raise KvsimError(f"{out}: is a folder; give a file name such as trace.parquet")
    if max_requests is not None and max_requests < 1:
        raise KvsimError(f"option 'max_requests' must be >= 1, got {max_requests!r}")
    check_writable(out.parent, "the trace")
    counts: list[tuple[int, int]] = []
    write_file(out, lambda tmp: counts.append(_convert(source, tmp, max_requests)),
               what="the trace")  # fmt: skip
    return counts[0]


def _convert(source: Chunked | Trace, out: Path, cap: int | None) -> tuple[int, int]:
    """Write `source` to `out` (a temporary of `convert_to_parquet`), at most `cap` rows."""
    if isinstance(source, Trace):
        table = source.table if cap is None else source.table.slice(0, cap)
        write_trace(table, out)
        return table.num_rows, source.skipped_rows
    meta = _metadata(source.name, source.native_block_size, source.description)
    schema = TRACE_SCHEMA.with_metadata(meta)
    pending = Requests.empty()
    parents = RequestIds()  # ids of written rows that pending rows name as parent
    written = 0
    with pq.ParquetWriter(out, schema) as writer:

        def emit(req: Requests) -> None:
            nonlocal written
            req = req.take(req.order()[: None if cap is None else cap - written])
            if not len(req):
                return
            table = req.to_table(
                name=source.name,
                native_block_size=source.native_block_size,
                description=source.description,
                first_id=written,
                earlier=parents,
            )
            writer.write_table(table.cast(schema))
            parents.add(*(table.column(c).to_numpy() for c in ("session_id", "turn", "request_id")))
            written += len(req)

        for chunk, frontier in source.chunks:
            pending = Requests.concat([pending, chunk])
            ready = pending.arrival_s < frontier
            emit(pending.take(ready))
            pending = pending.take(~ready)
            if written == cap:  # the first `cap` rows are written; the rest would follow them
                getattr(source.chunks, "close", lambda: None)()  # a generator: its files close
                break
            parents.keep(pending.parent_session, pending.parent_turn)
        else:
            emit(pending)
    if written == 0:
        raise source.no_requests()
    if source.errors.count:
        # The skipped count is known only at the end: rewrite the footer metadata.
        table = pq.read_table(out)  # read into memory whole, then written over
        meta[META_SKIPPED] = str(source.errors.count).encode()
        pq.write_table(table.replace_schema_metadata(meta), out)
    return written, source.errors.count


def read_trace_warnings(path: str | Path) -> tuple[str, ...]:
    """`Trace.warnings` of a written file, reading only its two time columns (streamed output
    was never one table in memory)."""
    path = Path(path)
    table = pq.read_table(path, columns=["arrival_s", "think_time_s"])
    name = (pq.read_schema(path).metadata or {}).get(b"kvsim.trace_name", b"").decode()
    return trace_warnings(table, name or str(path))

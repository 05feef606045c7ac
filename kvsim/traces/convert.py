"""Any source → canonical Parquet, streaming: rows are written in arrival order as they settle.

A chunk's rows earlier than the source's frontier can no longer be preceded by anything still to
come, so they are sorted and written; the rest wait for the next chunk. Memory stays at about one
chunk plus the sessions still in progress. Request ids are assigned in write order, which is the
canonical (arrival, session, turn) order, so the file reads back exactly as `load_trace` builds it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from kvsim.errors import TraceError
from kvsim.traces.common import Chunked, Requests
from kvsim.traces.schema import META_SKIPPED, TRACE_SCHEMA, Trace, _metadata, write_trace

__all__ = ["convert_to_parquet"]


def convert_to_parquet(source: Chunked | Trace, out: str | Path) -> tuple[int, int]:
    """Write `source` as a canonical Parquet file; returns (requests written, rows skipped)."""
    out = Path(out)
    if isinstance(source, Trace):
        write_trace(source, out)
        return len(source), source.skipped_rows
    meta = _metadata(source.name, source.native_block_size, source.description)
    schema = TRACE_SCHEMA.with_metadata(meta)
    pending = Requests.empty()
    written = 0
    tmp = out.with_name(out.name + ".partial")
    with pq.ParquetWriter(tmp, schema) as writer:

        def emit(req: Requests) -> None:
            nonlocal written
            if not len(req):
                return
            req = req.take(req.order())
            table = req.to_table(
                name=source.name,
                native_block_size=source.native_block_size,
                description=source.description,
                first_id=written,
            )
            writer.write_table(table.cast(schema))
            written += len(req)

        for chunk, frontier in source.chunks:
            pending = Requests.concat([pending, chunk])
            ready = pending.arrival_s < frontier
            emit(pending.take(ready))
            pending = pending.take(~ready)
        emit(pending)
    if written == 0:
        tmp.unlink(missing_ok=True)
        raise TraceError(f"{source.name}: no requests")
    if source.errors.count:
        # The skipped count is known only at the end: rewrite the footer metadata.
        table = pq.read_table(tmp)
        meta[META_SKIPPED] = str(source.errors.count).encode()
        pq.write_table(table.replace_schema_metadata(meta), out)
        tmp.unlink()
    else:
        tmp.replace(out)
    return written, source.errors.count

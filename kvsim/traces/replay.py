"""From a source to a Trace: gather chunks (`collect`) and replay real times at another rate
(`replay`). Every reader's `load` and the built-in named traces end here."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kvsim.errors import TraceError
from kvsim.traces.arrivals import retime_table
from kvsim.traces.common import Chunked, Requests
from kvsim.traces.schema import META_SKIPPED, Trace

if TYPE_CHECKING:
    from kvsim.traces.formats.base import ReadOptions

__all__ = ["collect", "replay", "session_starts"]


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


def session_starts(table: pa.Table) -> np.ndarray:
    """Each session's first arrival, in time order."""
    arrival = table.column("arrival_s").to_numpy()
    _, first = np.unique(table.column("session_id").to_numpy(), return_index=True)
    return np.sort(arrival[first])


def previous_turns(session: np.ndarray, turn: np.ndarray, closed: np.ndarray) -> np.ndarray:
    """Per row, the row of its session's turn before it when the row is a closed-loop turn,
    else -1."""
    order = np.lexsort((turn, session))
    s, k = session[order], turn[order]
    follows = np.zeros(len(order), dtype=bool)
    follows[1:] = closed[order][1:] & (s[1:] == s[:-1]) & (k[1:] == k[:-1] + 1)
    prev = np.full(len(order), -1, dtype=np.int64)
    prev[order[1:][follows[1:]]] = order[:-1][follows[1:]]
    return prev


class _Scaled:
    """Replay: the trace's own session starts, times `factor` (a process for `retime_table`)."""

    def __init__(self, starts: np.ndarray, factor: float) -> None:
        self._starts, self._factor, self._i = starts, factor, 0

    def draw(self, n: int) -> np.ndarray:
        out = self._starts[self._i : self._i + n] * self._factor
        self._i += n
        return out


def replay(trace: Trace, opts: ReadOptions) -> Trace:
    """Real timestamps: `rate` stretches session starts to that mean rate, `rate_scale` divides.

    Sessions move as a whole, so think times and turn order stay as they are.
    """
    factor = 1.0 / opts.rate_scale
    if opts.rate is not None:
        starts = session_starts(trace.table)
        span = float(starts[-1] - starts[0]) if starts.size else 0.0
        if span <= 0:
            raise TraceError(
                f"{trace.name}: all arrivals at one instant; option 'rate' cannot apply"
            )
        factor *= (starts.size / span) / opts.rate
    table = trace.table
    if factor != 1.0:
        starts = session_starts(table)
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

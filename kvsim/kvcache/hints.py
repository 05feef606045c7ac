"""The request hints of a trace: what a serving system knows about each request, read once.

A policy sees a request only through `kvsim.policies.base.RequestHint` (session, turn, parent
call, category, pending tool call); this turns the trace's columns into those hints, one per
request on demand, so nothing else of the trace reaches a policy. Whether the reply is a tool
call is known once the reply is decoded: a request's hint says so only when it finishes. Traces
written before the hint columns existed give the defaults (no parent, no category, no tool call).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvsim.policies.base import RequestHint


class TraceHints:
    """Per-request hint columns as numpy arrays; ``at(i)`` is request ``i``'s hint."""

    def __init__(self, table: pa.Table) -> None:
        n = table.num_rows
        names = table.schema.names
        self.session = table.column("session_id").to_numpy()
        self.turn = table.column("turn").to_numpy()
        self.parent = (
            table.column("parent_id").to_numpy() if "parent_id" in names else np.full(n, -1)
        )
        if "category" in names:
            encoded = pc.dictionary_encode(table.column("category")).combine_chunks()
            self.categories: list[str] = encoded.dictionary.to_pylist()
            self.category = encoded.indices.to_numpy(zero_copy_only=False)
        else:
            self.categories, self.category = [""], np.zeros(n, dtype=np.int32)
        if "tool_wait_s" in names:
            wait = table.column("tool_wait_s").fill_null(-1.0)
            self.tool_wait_s = wait.to_numpy()
        else:
            self.tool_wait_s = np.full(n, -1.0)

    def at(self, i: int, replied: bool = True) -> RequestHint:
        """Request ``i``'s hint; before its reply exists (``replied`` False: on arrival, while
        it runs) nobody knows whether the reply is a tool call, so ``tool_wait_s`` is -1."""
        return RequestHint(
            int(self.session[i]),
            int(self.turn[i]),
            int(self.parent[i]),
            self.categories[self.category[i]] if self.categories else "",
            float(self.tool_wait_s[i]) if replied else -1.0,
        )

"""The per-request table: one row per trace request, what happened to it and when.

Rows are recorded column by column as requests finish (or are refused), into preallocated
arrays: a finished request's Python object is dropped at once, so a million-request run holds
about 100 bytes a request, not a live object each. Requests still in the system when the run
ends are recorded then, as unfinished.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import pyarrow as pa

from kvsim.kvcache.hierarchy import Hierarchy
from kvsim.kvcache.request import Request

_FLOATS = ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "load_wait_s")
_INTS = ("cached_tokens", "preemptions", "recomputed_tokens", "rope_tokens", "transfer_bytes")
_HEADS = ("lossy_hits", "attention_mass_lost")  # head-granular HBM only (kvsim.kvcache.group_pool)
_STATUSES = pa.array(["rejected", "completed", "unfinished"])  # by code


class TraceColumns(Protocol):
    """The trace's own columns the table repeats."""

    request_id: np.ndarray
    session_id: np.ndarray
    turn: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray


class RequestLog:
    """Columnar record of every request's outcome, filled as requests leave the system."""

    def __init__(self, n: int, tiers: int) -> None:
        # the values a request that never ran would report (as a fresh Request has them)
        self.columns: dict[str, np.ndarray] = {
            "arrival_s": np.zeros(n),
            "scheduled_s": np.full(n, -1.0),
            "first_token_s": np.full(n, -1.0),
            "finish_s": np.full(n, -1.0),
            "load_wait_s": np.zeros(n),
            "cached_tokens": np.full(n, -1, dtype=np.int64),
            "preemptions": np.zeros(n, dtype=np.int64),
            "recomputed_tokens": np.zeros(n, dtype=np.int64),
            "rope_tokens": np.zeros(n, dtype=np.int64),
            "transfer_bytes": np.zeros(n, dtype=np.int64),
            "replica": np.zeros(n, dtype=np.int32),
            "lossy_hits": np.zeros(n, dtype=np.int64),
            "attention_mass_lost": np.zeros(n),
        }
        self.lower_tokens = np.zeros((tiers, n), dtype=np.int64)
        self.rejected = np.zeros(n, dtype=bool)

    def record(self, req: Request) -> None:
        i = req.index
        c = self.columns
        for name in _FLOATS:
            c[name][i] = getattr(req, name)
        for name in _INTS:
            c[name][i] = getattr(req, name)
        c["replica"][i] = req.replica
        for name in _HEADS:
            c[name][i] = getattr(req, name)
        if req.lower_tokens:
            self.lower_tokens[:, i] = req.lower_tokens

    def end_s(self, default: float) -> float:
        """When the last request finished (`default` when none did)."""
        finish = self.columns["finish_s"]
        done = finish[finish >= 0]
        return float(done.max()) if done.size else default

    def table(
        self,
        source: TraceColumns,
        hierarchy: Hierarchy | None,
        *,
        cluster: bool = False,
        pd: bool = False,
        heads: bool = False,
    ) -> pa.Table:
        """One row per request; a cluster run adds the serving `replica`, a P/D run the KV
        bytes each request pulled from its prefill replica, a head-granular HBM the hit blocks
        each request ran without some KV-head groups (`lossy_hits`) and the share of its
        attention they held (`attention_mass_lost`)."""
        c = self.columns
        rejected = self.rejected
        arrival, first, finish = c["arrival_s"], c["first_token_s"], c["finish_s"]
        scheduled = c["scheduled_s"]
        output = source.output_tokens
        n = len(arrival)
        done = (finish >= 0) & ~rejected
        nan = np.full(n, math.nan)
        ttft = np.where(done, first - arrival, nan)
        e2e = np.where(done, finish - arrival, nan)
        tpot = np.where(done & (output > 1), (finish - first) / np.maximum(output - 1, 1), nan)
        # as codes, not numpy strings (40 bytes a row: a window's slice has millions of rows)
        code = np.where(rejected, 0, np.where(done, 1, 2)).astype(np.int8)
        status = pa.DictionaryArray.from_arrays(code, _STATUSES).cast(pa.string())
        tiers = hierarchy.tiers if hierarchy is not None else []
        extra: dict[str, np.ndarray] = {}
        if cluster:
            extra["replica"] = c["replica"]
        if pd:
            extra["kv_transfer_bytes"] = c["transfer_bytes"]
        if heads:
            extra.update({name: c[name] for name in _HEADS})
        return pa.table(
            {
                "request_id": source.request_id,
                "session_id": source.session_id,
                "turn": source.turn,
                "status": status,
                "arrival_s": arrival,
                "scheduled_s": np.where(scheduled >= 0, scheduled, nan),
                "first_token_s": np.where(done, first, nan),
                "finish_s": np.where(done, finish, nan),
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": e2e,
                "input_tokens": source.input_tokens,
                "cached_tokens": np.maximum(c["cached_tokens"], 0),
                "output_tokens": output,
                "preemptions": c["preemptions"],
                "recomputed_tokens": c["recomputed_tokens"],
                "load_wait_s": c["load_wait_s"],
                "rope_reused_tokens": c["rope_tokens"],
                **{f"{tier.name}_tokens": self.lower_tokens[tier.index] for tier in tiers},
                **extra,
            }
        )

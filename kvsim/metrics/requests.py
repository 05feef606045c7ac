"""The per-request table: one row per trace request, what happened to it and when."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import pyarrow as pa

from kvsim.engine.request import Request
from kvsim.kvcache.hierarchy import Hierarchy


class TraceColumns(Protocol):
    """The trace's own columns the table repeats."""

    request_id: np.ndarray
    session_id: np.ndarray
    turn: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray


def requests_table(
    source: TraceColumns,
    requests: list[Request],
    rejected: np.ndarray,
    hierarchy: Hierarchy | None,
    *,
    cluster: bool = False,
    pd: bool = False,
) -> pa.Table:
    """One row per request; a cluster run adds the serving `replica`, a P/D run the KV bytes
    each request pulled from its prefill replica."""

    def col(name: str, dtype=np.float64) -> np.ndarray:
        return np.fromiter((getattr(r, name) for r in requests), dtype=dtype, count=len(requests))

    arrival = col("arrival_s")
    first = col("first_token_s")
    finish = col("finish_s")
    scheduled = col("scheduled_s")
    output = source.output_tokens
    done = (finish >= 0) & ~rejected
    nan = np.full(len(requests), math.nan)
    ttft = np.where(done, first - arrival, nan)
    e2e = np.where(done, finish - arrival, nan)
    tpot = np.where(done & (output > 1), (finish - first) / np.maximum(output - 1, 1), nan)
    status = np.where(rejected, "rejected", np.where(done, "completed", "unfinished"))
    tiers = hierarchy.tiers if hierarchy is not None else []
    extra: dict[str, np.ndarray] = {}
    if cluster:
        extra["replica"] = col("replica", np.int32)
    if pd:
        extra["kv_transfer_bytes"] = col("transfer_bytes", np.int64)
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
            "cached_tokens": np.maximum(col("cached_tokens", np.int64), 0),
            "output_tokens": output,
            "preemptions": col("preemptions", np.int64),
            "recomputed_tokens": col("recomputed_tokens", np.int64),
            "load_wait_s": col("load_wait_s"),
            "rope_reused_tokens": col("rope_tokens", np.int64),
            **{
                f"{tier.name}_tokens": np.fromiter(
                    (r.lower_tokens[tier.index] if r.lower_tokens else 0 for r in requests),
                    dtype=np.int64,
                    count=len(requests),
                )
                for tier in tiers
            },
            **extra,
        }
    )

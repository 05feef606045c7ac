"""Everything a run measured, as the engine hands it over; `kvsim.metrics.summary` turns it
into a summary and `kvsim.run` into files."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from kvsim.metrics.attribution import Attribution


@dataclass
class RunResult:
    """Everything a run measured; `kvsim.metrics` turns it into a summary and files."""

    requests: pa.Table
    simulated_s: float
    wall_s: float
    num_gpu_blocks: int
    block_bytes: int
    block_size: int
    iterations: int
    coalesced_steps: int
    busy_s: float
    block_ops: int
    evictions: int
    cost_model: str = "roofline"
    cost_model_reason: str = ""
    engine: str = ""  # the serving engine profile, name@version
    kernel_terms: str = ""  # where the cost model's kernel terms come from
    # a few batch shapes' iteration parts, ms (kvsim.costmodel.breakdown), shape -> part -> ms
    iteration_breakdown_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    tiers: dict[str, dict[str, float]] = field(default_factory=dict)
    links: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: pa.Table | None = None
    hourly_cost_usd: dict[str, float] = field(default_factory=dict)
    prefetched_blocks: int = 0
    replicas: list[dict[str, object]] = field(default_factory=list)
    router: str = ""  # set for a cluster run
    attribution: Attribution | None = None
    pd: dict[str, int] = field(default_factory=dict)  # set for a P/D run
    warnings: list[str] = field(default_factory=list)  # settings that did nothing
    # KV compression (kvsim.engine.compress): the run's canonical label, each request's
    # label (one value unless auto) and the most KV bytes it held at once (on one rank),
    # and the most KV bytes running requests held at once on one replica (one rank)
    compression: str = "none"
    request_compression: pa.Array | None = None
    kv_peak_bytes: np.ndarray | None = None
    peak_hbm_kv_bytes: int = 0

    def requests_with_compression(self) -> pa.Table:
        """`requests` with the columns every requests.parquet has: ``compression`` (the label
        each request ran with) and ``kv_peak_bytes`` (kept apart so that the table of a run
        without compression stays the one earlier versions wrote, byte for byte)."""
        t = self.requests
        if "compression" not in t.column_names:
            labels = self.request_compression
            if labels is None:
                labels = pa.array([self.compression] * t.num_rows, pa.string())
            t = t.append_column("compression", labels)
        if "kv_peak_bytes" not in t.column_names and self.kv_peak_bytes is not None:
            t = t.append_column("kv_peak_bytes", pa.array(self.kv_peak_bytes))
        return t

"""What the replica and its memory tiers look like over simulated time, and in total.

The timeline is sampled by one SimPy process at a fixed simulated interval (no per-token or
per-block events), kept in Python lists and turned into Arrow once at the end.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import simpy

from kvsim.kvcache.hierarchy import Hierarchy


class Timeline:
    """Samples queue lengths, HBM and tier occupancy, and link busy fractions."""

    def __init__(self, env: simpy.Environment, replica, hierarchy: Hierarchy, interval_s: float):
        self.env = env
        self.replica = replica
        self.hierarchy = hierarchy
        self.interval_s = interval_s
        self.columns: dict[str, list[float]] = {
            "time_s": [],
            "running": [],
            "waiting": [],
            "loading": [],
            "hbm_used_blocks": [],
            "hbm_cached_blocks": [],
        }
        for tier in hierarchy.tiers:
            self.columns[f"{tier.name}_blocks"] = []
            self.columns[f"{tier.name}_link_busy"] = []
        self._busy = {tier.name: 0.0 for tier in hierarchy.tiers}

    def sample(self, finished: Callable[[], bool]):
        """A SimPy process: one sample per interval until every request has finished."""
        while True:
            self._record()
            if finished():
                return
            yield self.env.timeout(self.interval_s)

    def _record(self) -> None:
        c = self.columns
        r = self.replica
        c["time_s"].append(self.env.now)
        c["running"].append(len(r.running))
        c["waiting"].append(len(r.waiting))
        c["loading"].append(len(r.loading))
        c["hbm_used_blocks"].append(r.pool.used)
        c["hbm_cached_blocks"].append(len(r.pool.refs))
        for tier in self.hierarchy.tiers:
            c[f"{tier.name}_blocks"].append(tier.resident)
            busy = tier.link.stats.busy_s
            c[f"{tier.name}_link_busy"].append(
                min((busy - self._busy[tier.name]) / self.interval_s, 1.0)
            )
            self._busy[tier.name] = busy

    def table(self) -> pa.Table:
        return pa.table(self.columns)


def tier_report(hierarchy: Hierarchy, block_bytes: int) -> dict[str, dict[str, float]]:
    """Per lower tier: capacity, occupancy, bytes in and out, tokens served, evictions."""
    out: dict[str, dict[str, float]] = {}
    for tier in hierarchy.tiers:
        s = tier.stats
        out[tier.name] = {
            "capacity_blocks": tier.capacity_blocks,
            "resident_blocks": tier.resident,
            "peak_resident_blocks": s.resident_peak,
            "bytes_written": s.written_in * block_bytes,
            "bytes_read": s.loaded_out * block_bytes,
            "served_tokens": s.served_tokens,
            "demoted_blocks": s.demoted_out,
            "dropped_blocks": s.dropped,
            "refused_blocks": s.refused,
        }
    return out


def link_report(hierarchy: Hierarchy) -> dict[str, dict[str, float]]:
    """Per link: bytes moved each way, busy time, and the delay sharing added to transfers."""
    out: dict[str, dict[str, float]] = {}
    for tier in hierarchy.tiers:
        s = tier.link.stats
        out[tier.name] = {
            "bytes_read": s.bytes_read,
            "bytes_written": s.bytes_written,
            "transfers": s.transfers,
            "busy_s": s.busy_s,
            "queueing_s_mean": s.queueing_s / s.transfers if s.transfers else 0.0,
        }
    return out

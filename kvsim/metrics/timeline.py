"""What the replicas and their memory tiers look like over simulated time, and in total.

The timeline is sampled by one SimPy process at a fixed simulated interval (no per-token or
per-block events), kept in Python lists and turned into Arrow once at the end. Through idle
stretches (no request anywhere, no transfer on any link) it takes no samples: it records the
idle state once and sleeps until the next request arrives, so a day-long gap in a trace costs
one row, not 86,400. Cluster columns
are totals over replicas (a shared tier counted once; a link's busy fraction averaged over the
replicas' links to that tier); a cluster run adds each replica's queue and HBM occupancy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa
import simpy

from kvsim.kvcache.hierarchy import Hierarchy, LowerTier
from kvsim.kvcache.link import Link


def _distinct_tiers(hierarchies: Iterable[Hierarchy]) -> dict[str, list[LowerTier]]:
    """Tier name -> its tier objects (one per replica, or the one a cluster shares)."""
    out: dict[str, list[LowerTier]] = {}
    seen: set[int] = set()
    for hierarchy in hierarchies:
        for tier in hierarchy.tiers:
            if id(tier) not in seen:
                seen.add(id(tier))
                out.setdefault(tier.name, []).append(tier)
    return out


def _distinct_links(tiers: list[LowerTier]) -> list[Link]:
    links: dict[int, Link] = {}
    for tier in tiers:
        links.setdefault(id(tier.link), tier.link)
    return list(links.values())


class Timeline:
    """Samples queue lengths, HBM and tier occupancy, and link busy fractions."""

    def __init__(self, env: simpy.Environment, replicas: list, interval_s: float) -> None:
        self.env = env
        self.replicas = replicas
        self.interval_s = interval_s
        self.tiers = _distinct_tiers(r.hierarchy for r in replicas if r.hierarchy is not None)
        self.links = {name: _distinct_links(tiers) for name, tiers in self.tiers.items()}
        self.columns: dict[str, list[float]] = {
            "time_s": [],
            "running": [],
            "waiting": [],
            "loading": [],
            "hbm_used_blocks": [],
            "hbm_cached_blocks": [],
        }
        for name in self.tiers:
            self.columns[f"{name}_blocks"] = []
            self.columns[f"{name}_link_busy"] = []
        self.per_replica = len(replicas) > 1
        if self.per_replica:
            for r in replicas:
                for what in ("waiting", "running", "hbm_used_blocks"):
                    self.columns[f"r{r.index}_{what}"] = []
        self._busy = {id(link): 0.0 for links in self.links.values() for link in links}
        self._all_links = [link for links in self.links.values() for link in links]
        self._idle: simpy.Event | None = None
        self._last_s = env.now
        self._woken = False

    def wake(self) -> None:
        """A request arrived: resume sampling if the timeline sleeps through an idle stretch."""
        idle = self._idle
        if idle is not None and not idle.triggered:
            idle.succeed()

    def _quiet(self) -> bool:
        for r in self.replicas:
            if r.running or r.waiting or r.loading:
                return False
        return all(link.idle for link in self._all_links)

    def sample(self, finished: Callable[[], bool]):
        """A SimPy process: one sample per interval until every request has finished."""
        while True:
            self._record()
            if finished():
                return
            if self._quiet():
                self._idle = self.env.event()
                yield self._idle
                self._idle = None
                self._woken = True
                continue
            yield self.env.timeout(self.interval_s)

    def _record(self) -> None:
        c = self.columns
        replicas = self.replicas
        now = self.env.now
        # one interval, or the time since the last sample when an arrival ended an idle stretch
        elapsed = now - self._last_s if self._woken else self.interval_s
        self._woken = False
        self._last_s = now
        c["time_s"].append(now)
        c["running"].append(sum(len(r.running) for r in replicas))
        c["waiting"].append(sum(len(r.waiting) for r in replicas))
        c["loading"].append(sum(len(r.loading) for r in replicas))
        c["hbm_used_blocks"].append(sum(r.pool.used for r in replicas))
        c["hbm_cached_blocks"].append(sum(len(r.pool.refs) for r in replicas))
        for name, tiers in self.tiers.items():
            c[f"{name}_blocks"].append(sum(t.resident for t in tiers))
            links = self.links[name]
            busy = 0.0
            for link in links:
                now_busy = link.stats.busy_s
                delta = now_busy - self._busy[id(link)]
                busy += min(delta / elapsed, 1.0) if elapsed > 0 else 0.0
                self._busy[id(link)] = now_busy
            c[f"{name}_link_busy"].append(busy / len(links))
        if self.per_replica:
            for r in replicas:
                c[f"r{r.index}_waiting"].append(len(r.waiting))
                c[f"r{r.index}_running"].append(len(r.running) + len(r.loading))
                c[f"r{r.index}_hbm_used_blocks"].append(r.pool.used)

    def table(self) -> pa.Table:
        return pa.table(self.columns)


def tier_report(hierarchies: list[Hierarchy], block_bytes: int) -> dict[str, dict[str, float]]:
    """Per lower tier, over the cluster: capacity, occupancy, bytes in and out, tokens served,
    evictions (a node-local tier summed over replicas, a shared one counted once)."""
    out: dict[str, dict[str, float]] = {}
    for name, tiers in _distinct_tiers(hierarchies).items():
        stats = [t.stats for t in tiers]
        out[name] = {
            "capacity_blocks": sum(t.capacity_blocks for t in tiers),
            "resident_blocks": sum(t.resident for t in tiers),
            "peak_resident_blocks": sum(s.resident_peak for s in stats),
            "bytes_written": sum(s.written_in for s in stats) * block_bytes,
            "bytes_read": sum(s.loaded_out for s in stats) * block_bytes,
            "served_tokens": sum(s.served_tokens for s in stats),
            "demoted_blocks": sum(s.demoted_out for s in stats),
            "dropped_blocks": sum(s.dropped for s in stats),
            "refused_blocks": sum(s.refused for s in stats),
        }
    return out


def _links_summary(links: list[Link]) -> dict[str, float]:
    transfers = sum(link.stats.transfers for link in links)
    queueing = sum(link.stats.queueing_s for link in links)
    return {
        "bytes_read": sum(link.stats.bytes_read for link in links),
        "bytes_written": sum(link.stats.bytes_written for link in links),
        "transfers": transfers,
        "busy_s": sum(link.stats.busy_s for link in links),
        "queueing_s_mean": queueing / transfers if transfers else 0.0,
    }


def link_report(hierarchies: list[Hierarchy]) -> dict[str, dict[str, float]]:
    """Per tier's link(s): bytes moved each way, busy time, and the delay sharing added."""
    return {
        name: _links_summary(_distinct_links(tiers))
        for name, tiers in _distinct_tiers(hierarchies).items()
    }


def pd_link_report(
    fabric: Link | None, nvlinks: list[Link], tier_links: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """The P/D hand-off paths: NVLink within nodes and, unless the rdma tier already reports
    it (the same link), the fabric between nodes."""
    out = {"pd_nvlink": _links_summary(nvlinks)}
    if "rdma" not in tier_links and fabric is not None:
        out["fabric"] = _links_summary([fabric])
    return out

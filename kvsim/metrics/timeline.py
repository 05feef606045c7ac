"""What the replicas and their memory tiers look like over simulated time, and in total.

The timeline is sampled by one SimPy process at a fixed simulated interval (no per-token or
per-block events), kept in Python lists and turned into Arrow once at the end. Through idle
stretches (no request in the system, no transfer on any link) it takes no samples: it records
the idle state once and sleeps until the next request arrives, so a day-long gap in a trace
costs one row, not 86,400. Cluster columns are totals over replicas (a shared tier counted once;
a link's busy fraction averaged over the replicas' links to that tier); a cluster run adds each
replica's queue and HBM occupancy.

"In the system" means arrived and not yet finished, counted from the arrivals (`wake`) and the
simulation's count of finished requests, not from the replicas' queues: a request spends time
where no queue holds it (the serving front end, a P/D hand-off between replicas). Judging
idleness by the queues once put the timeline to sleep at an arrival, before the request had
reached a queue, and it slept through the whole request: with sparse arrivals a run's timeline
showed no running request and no used HBM block at all.

Most columns are point samples: the state at the row's time. A request shorter than the interval
can still fall between two rows, so ``in_system_max`` is a maximum, not a sample: the most
requests in the system at any moment since the previous row (it can only rise at an arrival,
where it is updated; one counter per arrival, nothing per token). A busy stretch, however
short, shows in it.

The table is bounded, whatever the simulated time: at `MAX_CELLS` cells (rows × columns, at
least `MIN_ROWS` rows) it halves, keeping every second row (the point samples at that row's
time; ``in_system_max`` the larger of the pair, a link's busy fraction their time-weighted mean)
and doubling the interval from then on. A run that lasts ages of simulated time (a profile
with very slow hardware, an overloaded fleet) so keeps a coarser timeline, not one that grows
until memory runs out; no run of ordinary length comes near the bound.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

import pyarrow as pa
import simpy

from kvsim.kvcache.hierarchy import Hierarchy, LowerTier
from kvsim.kvcache.link import Link

#: Most cells (rows × columns) the timeline holds before it halves its rows: 2M numbers, about
#: 65 MB in Python lists; 200,000 rows of a one-replica run (55 hours at the default 1 s).
MAX_CELLS = 1 << 21
#: Fewest rows it halves at, however many columns (a fleet's per-replica columns).
MIN_ROWS = 1 << 10


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

    def __init__(
        self,
        env: simpy.Environment,
        replicas: list,
        interval_s: float,
        completed: Callable[[], int],
    ) -> None:
        """`completed` counts the requests that have finished (or were refused) so far."""
        self.env = env
        self.replicas = replicas
        self.interval_s = interval_s
        self._completed = completed
        self._arrived = 0
        self._peak = 0  # the most requests in the system since the last row
        hierarchies = (r.kv.hierarchy for r in replicas if r.kv.hierarchy is not None)
        self.tiers = _distinct_tiers(hierarchies)
        self.links = {name: _distinct_links(tiers) for name, tiers in self.tiers.items()}
        self.columns: dict[str, list[float]] = {
            "time_s": [],
            "running": [],
            "waiting": [],
            "loading": [],
            "hbm_used_blocks": [],
            "hbm_cached_blocks": [],
            "in_system_max": [],
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
        self._step_s = interval_s  # the wait before the next sample on the grid
        self._elapsed: list[float] = []  # what each row's busy fractions are a share of
        self.max_rows = max(MIN_ROWS, MAX_CELLS // len(self.columns)) // 2 * 2

    def wake(self) -> None:
        """A request arrived: count it, and resume sampling if the timeline sleeps through an
        idle stretch."""
        self._arrived += 1
        inside = self._arrived - self._completed()
        if inside > self._peak:
            self._peak = inside
        idle = self._idle
        if idle is not None and not idle.triggered:
            idle.succeed()

    def _quiet(self) -> bool:
        """No request in the system and no transfer on any link."""
        if self._arrived > self._completed():
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
            self._step_s = self.interval_s
            yield self.env.timeout(self._step_s)

    def _record(self) -> None:
        c = self.columns
        replicas = self.replicas
        now = self.env.now
        # one interval, or the time since the last sample when an arrival ended an idle stretch
        elapsed = now - self._last_s if self._woken else self._step_s
        self._elapsed.append(elapsed)
        self._woken = False
        self._last_s = now
        c["time_s"].append(now)
        inside = self._arrived - self._completed()
        c["in_system_max"].append(max(self._peak, inside))
        self._peak = inside
        c["running"].append(sum(len(r.running) for r in replicas))
        c["waiting"].append(sum(len(r.waiting) for r in replicas))
        c["loading"].append(sum(len(r.loading) for r in replicas))
        c["hbm_used_blocks"].append(sum(r.kv.pool.used for r in replicas))
        c["hbm_cached_blocks"].append(sum(len(r.kv.pool.refs) for r in replicas))
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
                c[f"r{r.index}_hbm_used_blocks"].append(r.kv.pool.used)
        if len(self._elapsed) >= self.max_rows:
            self._halve()

    def _halve(self) -> None:
        """Keep every second row (of each pair, the later), merging what each row measured over
        its interval with its dropped neighbour; sample half as often from now on."""
        e = self._elapsed
        first, second = e[0::2], e[1::2]
        for name, values in self.columns.items():
            if name == "in_system_max":
                values[:] = map(max, values[0::2], values[1::2])
            elif name.endswith("_link_busy"):
                pairs = zip(values[0::2], first, values[1::2], second, strict=True)
                values[:] = [
                    (b1 * e1 + b2 * e2) / (e1 + e2) if e1 + e2 > 0 else 0.0
                    for b1, e1, b2, e2 in pairs
                ]
            else:  # a point sample: the later row's
                del values[0::2]
        e[:] = map(operator.add, first, second)
        self.interval_s *= 2

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

"""One time window of a sharded run (kvsim.shard): what it simulates, what it counts.

A window's engine is given the trace up to the window's end plus its warm-up (the next
window's warm-up, served but not counted). Requests that arrive before ``timed_from_s`` (the
window's start less its warm-up) only warm the caches, replayed without timing
(kvsim.engine.warmup); the rest run in the timed engine, and of those, the ones arriving in
[``start_s``, ``end_s``) are counted (a request counts in the one window where it arrives, and
is followed until it finishes, past the window's end). The fleet's
counters (iterations, busy time, tier and link traffic, the timeline) are counted over
[``start_s``, ``end_s``): consecutive windows partition the clock, so sums over them add up.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import simpy

from kvsim.engine.assemble import Fleet
from kvsim.metrics.attribution import Attribution
from kvsim.metrics.result import RunResult
from kvsim.metrics.timeline import link_report, tier_report

#: tier_report fields that are levels, not running counts: a window keeps the value at its end
TIER_LEVELS = frozenset({"capacity_blocks", "resident_blocks", "peak_resident_blocks"})


@dataclass(frozen=True)
class Window:
    """Arrivals in [start_s, end_s) are counted; the engine is timed from start_s - warmup_s
    and also serves, uncounted, the arrivals up to end_s + warmup_s (the next window's
    warm-up): those keep the load after end_s, and the router's sequence, as in one run (a
    closed-loop turn can arrive well before its nominal trace time)."""

    start_s: float
    end_s: float
    warmup_s: float = 0.0

    @property
    def timed_from_s(self) -> float:
        return self.start_s - self.warmup_s

    @property
    def served_until_s(self) -> float:
        return self.end_s + self.warmup_s

    @property
    def whole(self) -> bool:
        """The window covers the whole trace: nothing to warm, nothing to leave out."""
        return self.start_s == -math.inf and self.end_s == math.inf


@dataclass
class Counters:
    """The fleet's running counts at one instant."""

    replicas: list[dict[str, float]]
    tiers: dict[str, dict[str, float]]
    links: dict[str, dict[str, float]]

    @classmethod
    def of(cls, fleet: Fleet) -> Counters:
        hierarchies = [r.kv.hierarchy for r in fleet.replicas if r.kv.hierarchy is not None]
        links = link_report(hierarchies)
        for figures in links.values():  # the mean is not a count: keep the total
            figures["queueing_s"] = figures.pop("queueing_s_mean") * figures["transfers"]
        return cls(
            replicas=[
                {
                    "iterations": r.iterations,
                    "coalesced_steps": r.coalesced_steps,
                    "busy_s": r.busy_s,
                    "block_ops": r.kv.block_ops,
                    "evicted_blocks": r.kv.pool.stats.evictions,
                    "prefetched_blocks": r.kv.prefetched_blocks,
                }
                for r in fleet.replicas
            ],
            tiers=tier_report(hierarchies, fleet.parts.tier_block_bytes),
            links=links,
        )


class WindowMeter:
    """Takes the fleet's counters when the window starts and when it ends (SimPy processes)."""

    def __init__(self, env: simpy.Environment, fleet: Fleet, window: Window) -> None:
        self.fleet = fleet
        self.window = window
        self.at_start: Counters | None = None
        self.at_end: Counters | None = None
        if math.isfinite(window.start_s):
            env.process(self._take(env, window.start_s, "at_start"))
        if math.isfinite(window.end_s):
            env.process(self._take(env, window.end_s, "at_end"))

    def _take(self, env: simpy.Environment, at_s: float, name: str):
        if at_s > env.now:
            yield env.timeout(at_s - env.now)
        setattr(self, name, Counters.of(self.fleet))

    def restrict(self, result: RunResult, arrival_s: np.ndarray) -> WindowResult:
        """`result` cut down to the window: its counted requests, its counters, its timeline."""
        window = self.window
        counted = (arrival_s >= window.start_s) & (arrival_s < window.end_s)
        rows = np.flatnonzero(counted)
        requests = result.requests.take(pa.array(rows))
        finish = requests.column("finish_s").to_numpy(zero_copy_only=False)
        finished = finish[np.isfinite(finish)]
        first = float(arrival_s[rows].min()) if rows.size else math.nan
        end = float(finished.max()) if finished.size else first
        start, stop = self.at_start, self.at_end
        if start is not None or stop is not None:
            result = _counted_between(result, start, stop or Counters.of(self.fleet))
        timeline = result.timeline
        if timeline is not None and not window.whole:
            t = timeline.column("time_s")
            keep = pc.and_(pc.greater_equal(t, window.start_s), pc.less(t, window.end_s))
            timeline = timeline.filter(keep)
        attribution = result.attribution
        if attribution is not None:
            attribution = _attribution_rows(attribution, rows)
        comp = result.request_compression
        peaks = result.kv_peak_bytes
        result = dataclasses.replace(
            result,
            requests=requests,
            simulated_s=max(end - first, 0.0) if rows.size else 0.0,
            timeline=timeline,
            attribution=attribution,
            request_compression=comp.take(pa.array(rows)) if comp is not None else None,
            kv_peak_bytes=peaks[rows] if peaks is not None else None,
        )
        return WindowResult(result, rows, first, end)


@dataclass
class WindowResult:
    """A window's result, its rows' places in the window's trace, and its first arrival and
    last finish (the merged run's simulated span is taken from these)."""

    result: RunResult
    rows: np.ndarray
    first_s: float
    end_s: float


def _attribution_rows(a: Attribution, rows: np.ndarray) -> Attribution:
    out = Attribution(a.ceiling[rows])
    out.best, out.chosen, out.exact = a.best[rows], a.chosen[rows], a.exact[rows]
    return out


def _counted_between(result: RunResult, start: Counters | None, stop: Counters) -> RunResult:
    """`result` with the fleet's counters as counted from `start` (None: zero) to `stop`."""
    zero = Counters([dict.fromkeys(r, 0) for r in stop.replicas], {}, {})
    start = start or zero
    replicas = [
        {k: v - before.get(k, 0) for k, v in after.items()}
        for after, before in zip(stop.replicas, start.replicas, strict=True)
    ]
    shown = ("iterations", "busy_s", "evicted_blocks", "prefetched_blocks")  # per replica
    by_replica = [
        {**stats, **{k: r[k] for k in shown}}
        for stats, r in zip(result.replicas, replicas, strict=True)
    ]
    tiers = {
        name: {
            k: v if k in TIER_LEVELS else v - start.tiers.get(name, {}).get(k, 0)
            for k, v in figures.items()
        }
        for name, figures in stop.tiers.items()
    }
    links: dict[str, dict[str, float]] = {}
    for name, figures in stop.links.items():
        before = start.links.get(name, {})
        moved = {k: v - before.get(k, 0) for k, v in figures.items()}
        transfers = moved["transfers"]
        queueing = moved.pop("queueing_s")
        moved["queueing_s_mean"] = queueing / transfers if transfers else 0.0
        links[name] = moved
    total = {k: sum(r[k] for r in replicas) for k in replicas[0]}
    return dataclasses.replace(
        result,
        iterations=total["iterations"],
        coalesced_steps=total["coalesced_steps"],
        busy_s=total["busy_s"] / len(replicas),
        block_ops=total["block_ops"],
        evictions=total["evicted_blocks"],
        prefetched_blocks=total["prefetched_blocks"],
        replicas=by_replica,
        tiers=tiers,
        links=links,
    )

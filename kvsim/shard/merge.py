"""Windows' results merged into one `RunResult`, as if one engine had run the whole trace.

Requests come back in trace order (each counted in the one window where it arrives). The
fleet's counters are sums over windows, which partition the clock (kvsim.engine.window); tier
levels are the last window's (residents) or the largest (peaks); a link's mean queueing is
weighted by its transfers. The simulated span runs from the first arrival to the last finish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from kvsim.engine.window import TIER_LEVELS, WindowResult
from kvsim.metrics.attribution import Attribution
from kvsim.metrics.result import RunResult


def merge(parts: Sequence[WindowResult]) -> RunResult:
    """One result from the windows' (in window order; their rows are the whole trace's)."""
    if len(parts) == 1:
        return parts[0].result
    results = [p.result for p in parts]
    index = np.concatenate([p.rows for p in parts])
    order = pa.array(np.argsort(index, kind="stable"))
    requests = pa.concat_tables([r.requests for r in results]).take(order)
    first = min((p.first_s for p in parts if p.rows.size), default=0.0)
    end = max((p.end_s for p in parts if p.rows.size), default=first)
    base = results[0]
    peaks = [r.kv_peak_bytes for r in results]
    timelines = [r.timeline for r in results if r.timeline is not None]
    return dataclasses.replace(
        base,
        requests=requests,
        simulated_s=max(end - first, 0.0),
        iterations=sum(r.iterations for r in results),
        coalesced_steps=sum(r.coalesced_steps for r in results),
        busy_s=sum(r.busy_s for r in results),
        block_ops=sum(r.block_ops for r in results),
        evictions=sum(r.evictions for r in results),
        tiers=_tiers([r.tiers for r in results]),
        links=_links([r.links for r in results]),
        timeline=pa.concat_tables(timelines) if timelines else None,
        prefetched_blocks=sum(r.prefetched_blocks for r in results),
        replicas=_replicas([r.replicas for r in results]),
        attribution=_attribution([r.attribution for r in results], np.argsort(index)),
        kv_peak_bytes=np.concatenate(peaks)[np.argsort(index)] if peaks[0] is not None else None,
        peak_hbm_kv_bytes=max(r.peak_hbm_kv_bytes for r in results),
    )


def _tiers(per_window: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for tiers in per_window:
        for name, figures in tiers.items():
            merged = out.setdefault(name, dict.fromkeys(figures, 0))
            for k, v in figures.items():
                if k == "peak_resident_blocks":
                    merged[k] = max(merged[k], v)
                elif k in TIER_LEVELS:
                    merged[k] = v  # the last window's level
                else:
                    merged[k] += v
    return out


def _links(per_window: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    queueing: dict[str, float] = {}
    for links in per_window:
        for name, figures in links.items():
            merged = out.setdefault(name, dict.fromkeys(figures, 0))
            for k, v in figures.items():
                if k != "queueing_s_mean":
                    merged[k] += v
            queueing[name] = queueing.get(name, 0.0) + figures["queueing_s_mean"] * figures.get(
                "transfers", 0
            )
    for name, merged in out.items():
        transfers = merged.get("transfers", 0)
        merged["queueing_s_mean"] = queueing[name] / transfers if transfers else 0.0
    return out


def _replicas(per_window: list[list[dict[str, object]]]) -> list[dict[str, object]]:
    out = [dict(r) for r in per_window[0]]
    for replicas in per_window[1:]:
        for merged, r in zip(out, replicas, strict=True):
            for k in ("iterations", "busy_s", "evicted_blocks", "prefetched_blocks"):
                merged[k] = merged[k] + r[k]  # type: ignore[operator]
    return out


def _attribution(parts: list[Attribution | None], order: np.ndarray) -> Attribution | None:
    if any(a is None for a in parts):
        return None
    whole = [a for a in parts if a is not None]
    out = Attribution(np.concatenate([a.ceiling for a in whole])[order])
    out.best = np.concatenate([a.best for a in whole])[order]
    out.chosen = np.concatenate([a.chosen for a in whole])[order]
    out.exact = np.concatenate([a.exact for a in whole])[order]
    return out

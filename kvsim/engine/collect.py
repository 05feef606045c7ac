"""A finished run's measurements gathered from its parts into one `RunResult`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kvsim.costmodel import CostModel
from kvsim.costmodel.breakdown import SHAPES, iteration_breakdown
from kvsim.engine.assemble import Fleet
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.tiers import hourly_cost_usd
from kvsim.engine.workload import Workload
from kvsim.metrics.result import RunResult
from kvsim.metrics.timeline import Timeline, link_report, pd_link_report, tier_report


def collect(workload: Workload, fleet: Fleet, timeline: Timeline, wall_s: float) -> RunResult:
    """Everything the run measured: per request, per tier and link, per replica, over time."""
    workload.unfinished()
    run, source, replicas = workload.run, workload.source, fleet.replicas
    config, split, count = run.config, run.pd_split, run.replica_count
    table = workload.log.table(
        source,
        replicas[0].kv.hierarchy,
        cluster=count > 1,
        pd=bool(split),
        heads=replicas[0].kv.pool.head_granular,
    )
    first = float(np.min(source.arrival_s)) if source.n else 0.0
    end = workload.log.end_s(first)
    hierarchies = [r.kv.hierarchy for r in replicas if r.kv.hierarchy is not None]
    links = link_report(hierarchies)
    if split is not None:
        links.update(pd_link_report(fleet.parts.fabric, list(fleet.nvlinks.values()), links))
    cluster, cost, block_bytes = fleet.cluster, fleet.parts.cost, run.block_bytes
    return RunResult(
        requests=table,
        simulated_s=max(end - first, 0.0),
        wall_s=wall_s,
        num_gpu_blocks=run.num_blocks,
        block_bytes=block_bytes,
        block_size=config.block_size,
        iterations=sum(r.iterations for r in replicas),
        coalesced_steps=sum(r.coalesced_steps for r in replicas),
        busy_s=sum(r.busy_s for r in replicas) / count,
        block_ops=sum(r.kv.block_ops for r in replicas),
        evictions=sum(r.kv.pool.stats.evictions for r in replicas),
        cost_model=cost.kind,
        cost_model_reason=cost.reason,
        engine=run.engine.full_name,
        kernel_terms=cost.kernel_terms,
        iteration_breakdown_ms=breakdown_ms(cost),
        tiers=tier_report(hierarchies, fleet.parts.tier_block_bytes),
        links=links,
        timeline=timeline.table(),
        hourly_cost_usd=hourly_cost_usd(run.profile, config, count),
        prefetched_blocks=sum(r.kv.prefetched_blocks for r in replicas),
        replicas=[replica_stats(r) for r in replicas],
        router=config.router if count > 1 else "",
        attribution=cluster.attribution,
        pd={"local_prefills": cluster.local_prefills, "disaggregated": cluster.disaggregated}
        if split
        else {},
        warnings=list(run.warnings),
        compression=run.compression.label,
        request_compression=_request_compression(workload, fleet),
        kv_peak_bytes=workload.kv_peak_blocks * block_bytes,
        peak_hbm_kv_bytes=max(r.kv.peak_used_blocks for r in replicas) * block_bytes,
    )


def breakdown_ms(cost: CostModel) -> dict[str, dict[str, float]]:
    """The parts of a decode step at batch 1 and 32 (1k context), for the run summary."""
    out = {}
    for label, prefill, decode in SHAPES[:2]:
        b = iteration_breakdown(cost, label, list(prefill), list(decode))
        out[label] = {
            **{k: round(v * 1e3, 4) for k, v in b.parts_s.items()},
            "iteration": round(b.total_s * 1e3, 4),
        }
    return out


def _request_compression(workload: Workload, fleet: Fleet) -> pa.Array | None:
    """Each request's compression label, under auto (None: every request ran the run's)."""
    if not workload.run.compression.per_request_choice:
        return None
    labels = pa.array([e.label for e in fleet.parts.engines], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(workload.comp_codes), labels).cast(pa.string())


def replica_stats(replica: Scheduler) -> dict[str, object]:
    """What one replica did, for the per-replica part of the summary."""
    return {
        "replica": replica.index,
        "role": replica.role,
        "node": replica.node,
        "iterations": replica.iterations,
        "busy_s": replica.busy_s,
        "evicted_blocks": replica.kv.pool.stats.evictions,
        "prefetched_blocks": replica.kv.prefetched_blocks,
    }

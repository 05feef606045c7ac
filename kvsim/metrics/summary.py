"""Turn a run's per-request table into the summary users compare runs by."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsim.errors import ConfigError
from kvsim.metrics.result import RunResult


def _pct(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if len(values) else math.nan


@dataclass(frozen=True)
class Slo:
    """Service-level objectives a request must meet to count towards goodput (None: no bound)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ConfigError(
                    f"slo.{name}: expected a positive number of seconds, got {value!r}"
                )

    @property
    def given(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None


def summarize(result: RunResult, slo: Slo | None = None) -> dict[str, object]:
    """Latency percentiles, throughput and prefix-cache hit ratio of completed requests.

    - `throughput_tokens_per_s`: generated tokens per simulated second (vLLM's benchmark calls it
      output token throughput); `total_throughput_tokens_per_s` counts input tokens too.
    - `prefix_hit_ratio`: reused input tokens / input tokens, token-weighted, over completed
      requests: found in HBM's prefix cache when first scheduled, or loaded from a lower tier;
      `hit_ratio_by_tier` splits it by where the tokens came from.
    - `cost_usd`: the replicas' GPUs and their share of every enabled tier below HBM, priced
      per hour by the profile, over the simulated time; per million tokens counts input + output.
    - `slo_attainment`: the share of all requests (refused and unfinished ones miss) whose TTFT
      and TPOT both meet the SLO; `goodput_tokens_per_s`: their output tokens per simulated
      second (DistServe's goodput, in tokens). Both null when no SLO is given.
    - `hit_attribution`: the trace's reuse ceiling (one infinite cache) split into what the
      replicas captured and what routing, eviction and stale router state lost, as shares of
      input tokens (kvsim.engine.cluster.Attribution).
    """
    t = result.requests
    status = t.column("status").to_numpy(zero_copy_only=False)
    done = status == "completed"
    ttft = t.column("ttft_s").to_numpy()
    tpot = t.column("tpot_s").to_numpy()
    e2e = t.column("e2e_s").to_numpy()
    input_tokens = t.column("input_tokens").to_numpy()[done]
    cached = t.column("cached_tokens").to_numpy()[done]
    lower = {name: int(t.column(f"{name}_tokens").to_numpy()[done].sum()) for name in result.tiers}
    output = t.column("output_tokens").to_numpy()[done]
    sim_s = result.simulated_s
    out_total = int(output.sum())
    in_total = int(input_tokens.sum())
    reused = int(cached.sum()) + sum(lower.values())
    by_tier = {"hbm": float(cached.sum() / in_total) if in_total else 0.0}
    by_tier.update({k: v / in_total if in_total else 0.0 for k, v in lower.items()})
    hourly = result.hourly_cost_usd
    cost_usd = sum(hourly.values()) * sim_s / 3600
    tokens_m = (in_total + out_total) / 1e6
    block_size = result.block_size
    captured_blocks = (
        t.column("cached_tokens").to_numpy()
        + sum(t.column(f"{name}_tokens").to_numpy() for name in result.tiers)
    ) // block_size
    attribution = (
        result.attribution.shares(
            np.asarray(captured_blocks), done, t.column("input_tokens").to_numpy(), block_size
        )
        if result.attribution is not None
        else None
    )
    out = {
        "requests": int(t.num_rows),
        "completed": int(done.sum()),
        "rejected": int((status == "rejected").sum()),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p99_s": _pct(tpot, 99),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p99_s": _pct(e2e, 99),
        "input_tokens": in_total,
        "cached_tokens": int(cached.sum()),
        "output_tokens": out_total,
        "prefix_hit_ratio": reused / in_total if in_total else 0.0,
        "hit_ratio_by_tier": by_tier,
        "throughput_tokens_per_s": out_total / sim_s if sim_s > 0 else 0.0,
        "total_throughput_tokens_per_s": (out_total + in_total) / sim_s if sim_s > 0 else 0.0,
        "requests_per_s": int(done.sum()) / sim_s if sim_s > 0 else 0.0,
        "preemptions": int(t.column("preemptions").to_numpy().sum()),
        "recomputed_tokens": int(t.column("recomputed_tokens").to_numpy().sum()),
        "kv_blocks": result.num_gpu_blocks,
        "kv_block_bytes_per_rank": result.block_bytes,
        "evicted_blocks": result.evictions,
        "iterations": result.iterations,
        "coalesced_decode_steps": result.coalesced_steps,
        "busy_fraction": result.busy_s / sim_s if sim_s > 0 else 0.0,
        "block_ops": result.block_ops,
        "cost_usd": cost_usd,
        "cost_per_million_tokens_usd": cost_usd / tokens_m if tokens_m else math.nan,
        "cost_per_million_output_tokens_usd": (
            cost_usd / (out_total / 1e6) if out_total else math.nan
        ),
        "hourly_cost_usd": hourly,
        "tiers": result.tiers,
        "links": result.links,
        "prefetched_blocks": result.prefetched_blocks,
        "rope_reused_tokens": int(t.column("rope_reused_tokens").to_numpy()[done].sum()),
        "load_wait_p50_s": _pct(t.column("load_wait_s").to_numpy()[done], 50),
        "cost_model": result.cost_model,
        "cost_model_reason": result.cost_model_reason,
        "engine": result.engine,
        "kernel_terms": result.kernel_terms,
        "iteration_breakdown_ms": result.iteration_breakdown_ms,
        "simulated_s": sim_s,
        "wall_s": result.wall_s,
        **_slo_figures(t, slo, sim_s),
        "hit_attribution": attribution,
    }
    if "lossy_hits" in t.column_names:  # head-granular HBM: means per completed request
        for name in ("lossy_hits", "attention_mass_lost"):
            values = t.column(name).to_numpy()[done]
            out[f"{name}_per_request"] = float(values.mean()) if values.size else 0.0
    if result.replicas and (len(result.replicas) > 1 or result.pd):
        out.update(_cluster_figures(result, t, done, sim_s))
    return out


def _slo_figures(t, slo: Slo | None, sim_s: float) -> dict[str, object]:
    if slo is None or not slo.given:
        return {"slo": None, "slo_attainment": None, "goodput_tokens_per_s": None}
    status = t.column("status").to_numpy(zero_copy_only=False)
    meets = status == "completed"
    if slo.ttft_s is not None:
        meets &= t.column("ttft_s").to_numpy() <= slo.ttft_s
    if slo.tpot_s is not None:
        tpot = t.column("tpot_s").to_numpy()
        meets &= np.isnan(tpot) | (tpot <= slo.tpot_s)  # a one-token reply has no TPOT
    good = int(t.column("output_tokens").to_numpy()[meets].sum())
    return {
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "slo_attainment": float(meets.mean()) if len(meets) else 0.0,
        "goodput_tokens_per_s": good / sim_s if sim_s > 0 else 0.0,
    }


def _cluster_figures(result: RunResult, t, done: np.ndarray, sim_s: float) -> dict[str, object]:
    """`replicas`, `router`, `per_replica` and, under P/D, the hand-off figures."""
    replica = t.column("replica").to_numpy()
    ttft = t.column("ttft_s").to_numpy()
    inputs = t.column("input_tokens").to_numpy()
    reused = t.column("cached_tokens").to_numpy() + sum(
        t.column(f"{name}_tokens").to_numpy() for name in result.tiers
    )
    preemptions = t.column("preemptions").to_numpy()
    per_replica = []
    for stats in result.replicas:
        mine = replica == stats["replica"]
        ok = mine & done
        in_total = int(inputs[ok].sum())
        busy = float(stats["busy_s"])  # type: ignore[arg-type]
        per_replica.append(
            {
                "replica": stats["replica"],
                "role": stats["role"],
                "node": stats["node"],
                "requests": int(mine.sum()),
                "completed": int(ok.sum()),
                "ttft_p50_s": _pct(ttft[mine], 50),
                "ttft_p99_s": _pct(ttft[mine], 99),
                "prefix_hit_ratio": int(reused[ok].sum()) / in_total if in_total else 0.0,
                "busy_fraction": busy / sim_s if sim_s > 0 else 0.0,
                "iterations": stats["iterations"],
                "evicted_blocks": stats["evicted_blocks"],
                "preemptions": int(preemptions[mine].sum()),
            }
        )
    out: dict[str, object] = {
        "replicas": len(result.replicas),
        "router": result.router,
        "per_replica": per_replica,
    }
    if result.pd:
        roles = [s["role"] for s in result.replicas]
        out["pd"] = {
            "prefill_replicas": roles.count("prefill"),
            "decode_replicas": roles.count("decode"),
            **result.pd,
            "kv_transfer_bytes": int(t.column("kv_transfer_bytes").to_numpy().sum()),
        }
    return out

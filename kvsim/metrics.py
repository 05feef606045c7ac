"""Turn a run's per-request table into the summary users compare runs by."""

from __future__ import annotations

import math

import numpy as np

from kvsim.engine.simulation import RunResult


def _pct(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if len(values) else math.nan


def summarize(result: RunResult) -> dict[str, object]:
    """Latency percentiles, throughput and prefix-cache hit ratio of completed requests.

    - `throughput_tokens_per_s`: generated tokens per simulated second (vLLM's benchmark calls it
      output token throughput); `total_throughput_tokens_per_s` counts input tokens too.
    - `prefix_hit_ratio`: cached input tokens / input tokens, token-weighted, over completed
      requests, where cached means found in the prefix cache when first scheduled.
    """
    t = result.requests
    status = t.column("status").to_numpy(zero_copy_only=False)
    done = status == "completed"
    ttft = t.column("ttft_s").to_numpy()
    tpot = t.column("tpot_s").to_numpy()
    e2e = t.column("e2e_s").to_numpy()
    input_tokens = t.column("input_tokens").to_numpy()[done]
    cached = t.column("cached_tokens").to_numpy()[done]
    output = t.column("output_tokens").to_numpy()[done]
    sim_s = result.simulated_s
    out_total = int(output.sum())
    in_total = int(input_tokens.sum())
    return {
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
        "prefix_hit_ratio": float(cached.sum() / in_total) if in_total else 0.0,
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
        "cost_model": result.cost_model,
        "cost_model_reason": result.cost_model_reason,
        "simulated_s": sim_s,
        "wall_s": result.wall_s,
    }

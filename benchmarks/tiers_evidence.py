"""What the tiers below HBM are worth: mooncake-conversation on one replica, four hierarchies.

    python benchmarks/tiers_evidence.py [--model llama-3.1-70b --tp 8 --hardware h100-sxm]

Prints a Markdown table (TTFT p50/p99, throughput, hit ratio by tier, cost per million tokens)
for HBM only, +DRAM, +DRAM+NVMe and all six tiers. The README records its output.
"""

from __future__ import annotations

import argparse
import time

from kvsim.engine import EngineConfig, simulate
from kvsim.hardware import load_profile
from kvsim.metrics import summarize
from kvsim.models import load_model
from kvsim.traces import load_trace

CONFIGS = {
    "HBM only": "hbm",
    "+DRAM": "hbm,dram",
    "+DRAM+NVMe": "hbm,dram,nvme",
    "all six": "all",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conversation")
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--max-requests", type=int)
    args = parser.parse_args()
    trace = load_trace(args.trace, rate_scale=args.rate_scale, max_requests=args.max_requests)
    model, profile = load_model(args.model), load_profile(args.hardware)
    print(
        f"{args.trace}, {len(trace)} requests, {args.model} tp={args.tp} on {args.hardware}, "
        f"rate x{args.rate_scale}\n"
    )
    print(
        "| tiers | TTFT p50 | TTFT p99 | output tok/s | hit ratio (by tier) | $/M tokens | wall |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, tiers in CONFIGS.items():
        start = time.perf_counter()
        result = simulate(trace, model, profile, EngineConfig(tp=args.tp, tiers=tiers))
        s = summarize(result)
        by_tier = ", ".join(f"{k} {v:.3f}" for k, v in s["hit_ratio_by_tier"].items() if v)
        print(
            f"| {label} | {s['ttft_p50_s']:.2f} s | {s['ttft_p99_s']:.2f} s "
            f"| {s['throughput_tokens_per_s']:,.0f} | {s['prefix_hit_ratio']:.3f} ({by_tier}) "
            f"| ${s['cost_per_million_tokens_usd']:.3f} | {time.perf_counter() - start:.0f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()

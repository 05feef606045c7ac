"""What routing, P/D splits and a shared pool do to a fleet: one trace, one table.

    python benchmarks/cluster_evidence.py [--trace mooncake-conversation] [--replicas 8]

Runs the same trace through `--replicas` Llama-3.1-8B / H100 replicas behind each router, then
P/D splits of the same GPUs, then a shared RDMA pool, and prints a Markdown table (TTFT p50/p99,
SLO attainment under TTFT <= 2 s and TPOT <= 100 ms, hit ratio and the reuse ceiling's split).
The README records its output.
"""

from __future__ import annotations

import argparse

from kvsim.engine import EngineConfig, simulate
from kvsim.hardware import load_profile
from kvsim.metrics import Slo, summarize
from kvsim.models import load_model
from kvsim.traces import load_trace


def configs(replicas: int) -> dict[str, dict[str, object]]:
    p = max(replicas // 4, 1)
    return {
        "round-robin": dict(replicas=replicas, router="round-robin"),
        "session": dict(replicas=replicas, router="session"),
        "sglang-cache-aware": dict(replicas=replicas, router="sglang-cache-aware"),
        "dynamo-kv": dict(replicas=replicas, router="dynamo-kv"),
        "llm-d": dict(replicas=replicas, router="llm-d"),
        "min-ttft": dict(replicas=replicas, router="min-ttft"),
        "dynamo-kv, router state 10 s old": dict(
            replicas=replicas, router="dynamo-kv", router_refresh_s=10.0
        ),
        f"llm-d, P/D {p}:{replicas - p}": dict(pd=f"{p}:{replicas - p}", router="llm-d"),
        f"llm-d, P/D {replicas // 2}:{replicas // 2}": dict(
            pd=f"{replicas // 2}:{replicas // 2}", router="llm-d"
        ),
        "min-ttft + shared 1 TiB RDMA pool": dict(
            replicas=replicas, router="min-ttft", tiers="hbm,dram,rdma", tier_capacity="rdma=1TiB"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conversation")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--max-requests", type=int)
    args = parser.parse_args()
    trace = load_trace(args.trace, max_requests=args.max_requests)
    model, profile = load_model("llama-3.1-8b"), load_profile("h100-sxm")
    slo = Slo(ttft_s=2.0, tpot_s=0.1)
    print(f"{args.trace}, {len(trace)} requests, {args.replicas} x llama-3.1-8b on h100-sxm\n")
    print(
        "| configuration | TTFT p50 | TTFT p99 | SLO attainment | hit ratio "
        "| ceiling = captured + routing + eviction + staleness | wall |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, engine in configs(args.replicas).items():
        result = simulate(trace, model, profile, EngineConfig(**engine))  # type: ignore[arg-type]
        s = summarize(result, slo)
        a = s["hit_attribution"]
        print(
            f"| {name} | {s['ttft_p50_s']:.2f} s | {s['ttft_p99_s']:.2f} s "
            f"| {s['slo_attainment']:.3f} | {s['prefix_hit_ratio']:.3f} "
            f"| {a['ceiling']:.3f} = {a['captured']:.3f} + {a['lost_to_routing']:.3f} "
            f"+ {a['lost_to_eviction']:.3f} + {a['lost_to_staleness']:.3f} "
            f"| {result.wall_s:.0f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()

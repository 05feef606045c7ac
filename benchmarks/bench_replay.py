"""Replay a whole trace at its real timestamps and report the simulator's own speed.

    python benchmarks/bench_replay.py                       # mooncake-conversation, defaults
    python benchmarks/bench_replay.py --model llama-3.1-70b --tp 8 --hardware h200-sxm

Reports wall time, simulated requests per second of wall time, block operations per second and
peak resident memory. Asserts nothing: the figures go in the README.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from kvsim.engine import EngineConfig, simulate
from kvsim.hardware import load_profile
from kvsim.metrics import summarize
from kvsim.models import load_model
from kvsim.traces import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conversation")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--tiers", default="hbm", help="memory tiers (default: HBM only)")
    args = parser.parse_args()

    start = time.perf_counter()
    trace = load_trace(args.trace, rate_scale=args.rate_scale)
    load_s = time.perf_counter() - start
    config = EngineConfig(
        tp=args.tp, block_size=args.block_size, policy=args.policy, tiers=args.tiers
    )
    result = simulate(trace, load_model(args.model), load_profile(args.hardware), config)
    summary = summarize(result)
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {
        "trace": args.trace,
        "config": vars(args),
        "requests": summary["requests"],
        "input_tokens": summary["input_tokens"],
        "load_s": round(load_s, 2),
        "simulate_s": round(result.wall_s, 2),
        "wall_s": round(wall, 2),
        "simulated_requests_per_wall_s": round(summary["requests"] / result.wall_s),
        "block_ops": result.block_ops,
        "block_ops_per_wall_s": round(result.block_ops / result.wall_s),
        "iterations": result.iterations,
        "coalesced_decode_steps": result.coalesced_steps,
        "peak_rss_mib": round(peak_mib),
        "simulated_s": round(summary["simulated_s"], 1),
        "ttft_p50_s": round(summary["ttft_p50_s"], 3),
        "prefix_hit_ratio": round(summary["prefix_hit_ratio"], 4),
        "python": sys.version.split()[0],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

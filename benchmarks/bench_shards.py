"""How far a sharded run (`kvsim run --shards N --warmup S`) is from the unsharded one.

Runs one fleet unsharded, then sharded into each of --shards windows with each of --warmups
seconds of timed warm-up, and reports, against the unsharded run: the hit ratio of every tier
(absolute difference), TTFT and TPOT p50 / p99 and output throughput (relative), SLO
attainment (absolute), and CPU seconds (the slowest shard's: what a cluster with a core per
shard would take; their sum: what the run costs), CPU rather than wall time so that a busy
machine does not blur them. Goals (issue 24): hit ratio within 0.01, p50 within
2 %, p99 within 5 %.

    python benchmarks/bench_shards.py --synth 1000000 --replicas 64    # the README's 1M fleet
    python benchmarks/bench_shards.py --synth 100000 --replicas 16 --shards 2,4,8,16 \\
        --warmups 0,30,120 --jobs 2 --json shards.json

The trace is lmsys-shaped (`kvsim trace synth lmsys`, one hour per million requests, as
bench_cluster.py makes it), or any --trace. Shards run on local processes (--jobs). Asserts
nothing: the figures go in docs/sharding.md.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ONE_HOUR_SESSIONS_PER_S = 137.0  # as bench_cluster.py: ~1M lmsys requests an hour


def synth(n: int, seed: int) -> str:
    path = Path(tempfile.mkdtemp()) / f"lmsys-{n}.parquet"
    rate = ONE_HOUR_SESSIONS_PER_S * n / 1_000_000
    command = [sys.executable, "-m", "kvsim", "trace", "synth", "lmsys", "--requests", str(n)]
    command += ["--rate", str(rate), "--seed", str(seed), "-o", str(path)]
    subprocess.run(
        command,
        check=True,
        capture_output=True,
    )
    return str(path)


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    out = {
        "hit_ratio": summary["prefix_hit_ratio"],
        **{f"hit_{k}": v for k, v in summary["hit_ratio_by_tier"].items()},
        **{k: summary[k] for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")},
        "throughput": summary["throughput_tokens_per_s"],
        "slo_attainment": summary["slo_attainment"],
        "wall_s": summary["wall_s"],
    }
    return out


def errors(got: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Absolute for ratios, relative for times and throughput."""
    out = {}
    for k, v in got.items():
        if k in ("wall_s", "cpu_s") or k not in base:
            continue
        if k.startswith("hit") or k == "slo_attainment":
            out[k] = v - base[k]
        else:
            out[k] = v / base[k] - 1 if base[k] else math.nan
    return out


def meets(err: dict[str, float]) -> bool:
    hits = all(abs(v) <= 0.01 for k, v in err.items() if k.startswith("hit"))
    p50 = all(abs(err[k]) <= 0.02 for k in ("ttft_p50_s", "tpot_p50_s"))
    p99 = all(abs(err[k]) <= 0.05 for k in ("ttft_p99_s", "tpot_p99_s"))
    return hits and p50 and p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="a trace name or file (default: --synth)")
    parser.add_argument("--synth", type=int, default=100_000, help="lmsys-shaped requests")
    parser.add_argument(
        "--max-requests", type=int, help="of --trace (default: the trace's default run)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--router", default="round-robin")
    parser.add_argument("--tiers", default="hbm,dram")
    parser.add_argument("--tier-capacity", default="", help="per node, e.g. dram=256GiB")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--shards", default="2,4,8,16")
    parser.add_argument("--warmups", default="0,60,300")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--slo-ttft", type=float, default=1.0)
    parser.add_argument("--slo-tpot", type=float, default=0.05)
    parser.add_argument("--json", help="write every point here as JSON")
    args = parser.parse_args()

    from kvsim.engine import EngineConfig
    from kvsim.run import RunConfig, run
    from kvsim.shard import Sharding, run_split

    trace = args.trace or synth(args.synth, args.seed)
    config = RunConfig(
        trace=trace,
        max_requests=args.max_requests if args.trace else args.synth,
        rate_scale=args.rate_scale,
        slo_ttft_s=args.slo_ttft,
        slo_tpot_s=args.slo_tpot,
        engine=EngineConfig(
            replicas=args.replicas,
            router=args.router,
            tiers=args.tiers,
            tier_capacity=args.tier_capacity,
        ),
    )
    start, cpu = time.perf_counter(), time.process_time()
    base = run(config)
    base_figures = figures(base.summary)
    base_figures["wall_s"] = time.perf_counter() - start
    base_figures["cpu_s"] = time.process_time() - cpu
    points: list[dict[str, Any]] = [{"shards": 1, "warmup_s": 0, **base_figures}]
    print(json.dumps(points[0]), flush=True)
    for shards in map(int, args.shards.split(",")):
        for warmup in map(float, args.warmups.split(",")):
            start = time.perf_counter()
            outcome = run_split(config, Sharding(shards, warmup, jobs=args.jobs))
            got = figures(outcome.summary)
            got["wall_s"] = time.perf_counter() - start
            walls = outcome.summary["shard_cpu_s"]
            rss = [r for r in outcome.summary["shard_peak_rss_bytes"] if r]
            point = {
                "shards": shards,
                "warmup_s": warmup,
                **got,
                "slowest_shard_cpu_s": max(walls),
                "cpu_s": sum(walls),
                "peak_rss_mib": max(rss) / 2**20 if rss else None,
                "error": errors(got, base_figures),
            }
            point["meets_goals"] = meets(point["error"])
            points.append(point)
            print(json.dumps(point), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(points, indent=1) + "\n")
    print(table(points, base.summary, args))


def table(points: list[dict[str, Any]], summary: dict[str, Any], args: argparse.Namespace) -> str:
    tiers = [k for k in points[0] if k.startswith("hit_") and k != "hit_ratio"]
    head = (
        f"\n{summary['requests']:,} requests, {args.replicas} replicas ({args.router}), "
        f"{args.tiers}; unsharded: {points[0]['cpu_s']:.0f} s CPU, hit ratio "
        f"{points[0]['hit_ratio']:.4f}, TTFT p50 {points[0]['ttft_p50_s'] * 1e3:.1f} ms\n\n"
    )
    cols = ["shards", "warm-up s", *(f"Δ{t[4:]}" for t in tiers), "Δhit"]
    cols += ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "tok/s", "ΔSLO"]
    cols += ["slowest shard, CPU s", "all shards, CPU s", "speed-up", "goals"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for p in points[1:]:
        e = p["error"]
        cells = [str(p["shards"]), f"{p['warmup_s']:g}"]
        cells += [f"{e[t]:+.4f}" for t in tiers] + [f"{e['hit_ratio']:+.4f}"]
        cells += [
            f"{e[k] * 100:+.1f} %"
            for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "throughput")
        ]
        cells += [f"{e['slo_attainment']:+.4f}"]
        cells += [f"{p['slowest_shard_cpu_s']:.0f}", f"{p['cpu_s']:.0f}"]
        cells += [f"{points[0]['cpu_s'] / p['slowest_shard_cpu_s']:.1f}x"]
        cells += ["met" if p["meets_goals"] else "missed"]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines)


if __name__ == "__main__":
    main()

"""How fast a cluster simulates, and how wall time grows with replicas and with trace length.

    python benchmarks/bench_cluster.py                         # mooncake-conversation, 8 replicas
    python benchmarks/bench_cluster.py --replicas 64 --synth 1000000   # lmsys-shaped, one hour
    python benchmarks/bench_cluster.py --sweep replicas        # 1, 4, 16, 64 on one trace
    python benchmarks/bench_cluster.py --sweep length          # 125k .. 1M requests, 64 replicas
    python benchmarks/bench_cluster.py --replicas 64 --synth 1000000 --progress 50000

`--progress N` prints the CPU time of every N requests to stderr: this shared machine's speed
moves within the hour (18 to 46 s per 50 k requests inside one 1 M run), and a steady run shows
it as steps rather than a trend.

Each point runs in its own process, so its peak resident memory is its own. Prints one JSON
object per point (and a table for a sweep). Asserts nothing: the figures go in the README.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONE_HOUR_SESSIONS_PER_S = 137.0  # lmsys generator: ~2 turns a session, so ~1M requests an hour


def one_point(args: argparse.Namespace) -> dict[str, object]:
    from kvsim.engine import EngineConfig, simulate
    from kvsim.hardware import load_profile
    from kvsim.metrics import summarize
    from kvsim.models import load_model
    from kvsim.traces import load_trace

    start = time.perf_counter()
    trace_name = args.trace
    if args.synth:
        path = Path(tempfile.mkdtemp()) / "lmsys.parquet"
        rate = ONE_HOUR_SESSIONS_PER_S * args.synth / 1_000_000
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kvsim",
                "trace",
                "synth",
                "lmsys",
                "--requests",
                str(args.synth),
                "--rate",
                str(rate),
                "-o",
                str(path),
            ],
            check=True,
            capture_output=True,
        )
        trace_name = str(path)
    trace = load_trace(trace_name, max_requests=args.max_requests)
    config = EngineConfig(replicas=args.replicas, router=args.router, tiers=args.tiers)
    result = simulate(
        trace, load_model(args.model), load_profile(args.hardware), config, _progress(args.progress)
    )
    summary = summarize(result)
    return {
        "trace": args.trace if not args.synth else f"lmsys-synth-{args.synth}",
        "requests": summary["requests"],
        "replicas": args.replicas,
        "router": args.router,
        "tiers": args.tiers or "profile default",
        "simulated_s": round(result.simulated_s, 1),
        "simulate_wall_s": round(result.wall_s, 2),
        "cpu_s": round(time.process_time(), 1),
        "total_wall_s": round(time.perf_counter() - start, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "ttft_p50_s": round(summary["ttft_p50_s"], 3),
        "prefix_hit_ratio": round(summary["prefix_hit_ratio"], 4),
    }


def _progress(every: int | None):
    """A progress callback printing the CPU seconds of each `every` finished requests."""
    if not every:
        return None
    last = [time.process_time()]

    def report(done: int, total: int) -> None:
        if done % every == 0 or done == total:
            now = time.process_time()
            print(f"{done}/{total}: {now:.1f} s of CPU (+{now - last[0]:.1f})", file=sys.stderr)
            last[0] = now

    return report


def sweep(kind: str, base: list[str]) -> None:
    points = (
        [["--replicas", str(r)] for r in (1, 4, 16, 64)]
        if kind == "replicas"
        else [
            ["--replicas", "64", "--synth", str(n)] for n in (125_000, 250_000, 500_000, 1_000_000)
        ]
    )
    rows = []
    for extra in points:
        proc = subprocess.run(
            [sys.executable, __file__, *base, *extra], capture_output=True, text=True, check=True
        )
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(
        f"\n{'requests':>9} {'replicas':>8} {'wall s':>8} {'peak MiB':>8} {'wall s / 1k req':>15}"
    )
    for r in rows:
        per_k = r["simulate_wall_s"] / r["requests"] * 1000
        print(
            f"{r['requests']:>9} {r['replicas']:>8} {r['simulate_wall_s']:>8} "
            f"{r['peak_rss_mib']:>8} {per_k:>15.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conversation")
    parser.add_argument("--synth", type=int, help="synthesize an lmsys trace of N requests")
    parser.add_argument("--max-requests", type=int)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--router", default="round-robin")
    parser.add_argument("--tiers", help="memory tiers (default: the profile's, hbm + dram)")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--sweep", choices=["replicas", "length"])
    parser.add_argument("--progress", type=int, metavar="N", help="CPU time every N requests")
    args, _ = parser.parse_known_args()
    if args.progress is not None and args.progress < 1:
        parser.error(f"--progress: expected a number of requests >= 1, got {args.progress}")
    if args.sweep:
        base = [a for a in sys.argv[1:] if a not in ("--sweep", args.sweep)]
        sweep(args.sweep, base)
        return
    print(json.dumps(one_point(args)))


if __name__ == "__main__":
    main()

"""A day of a large fleet's traffic, sharded: what each window costs, and what the day would
take on this machine and on a Ray cluster (issue 24, item 4).

Reads a canonical Parquet trace (make one with `kvsim trace synth lmsys --requests 20000000
--rate 114.6 -o day.parquet`: 24 hours of LMSYS-shaped traffic, streamed to Parquet), then:

1. the caller's part, measured: re-timing the file in batches into the copy windows read, and
   cutting the windows (kvsim.shard.source);
2. `--sample` windows spread over the day, each run alone in a fresh process as a worker runs
   it (its slice read from the file, cache-only warm-up, timed engine): CPU seconds, wall
   seconds, peak RSS, requests counted and read;
3. an unsharded run of the first `--unsharded-requests` requests in a fresh process: CPU
   seconds per request, projected to the whole trace (linear: the fleet's caches fill in the
   first hours, so later requests may cost more or less; said in the output).

Projections from the measured windows: on C cores the day takes about max(the slowest window,
the sum of the windows / C) after the caller's part. Asserts nothing; the figures go in
docs/sharding.md.

    python benchmarks/bench_day.py --trace day.parquet --replicas 256 --shards 128 \\
        --sample 4 --json day.json
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np


def _config(trace: str, replicas: int, max_requests: int | None = None) -> Any:
    from kvsim.engine import EngineConfig
    from kvsim.run import RunConfig

    return RunConfig(trace=trace, max_requests=max_requests, engine=EngineConfig(replicas=replicas))


def _window(task: Any) -> dict[str, Any]:
    """One window, as a worker runs it (in a fresh process: its own peak RSS)."""
    from kvsim.shard.run import run_window_task

    outcome = run_window_task(task)
    if outcome.error is not None:
        raise SystemExit(f"window {task.index}: {outcome.error}")
    assert outcome.result is not None
    return {
        "index": task.index,
        "start_s": task.window.start_s,
        "end_s": task.window.end_s,
        "counted": int(outcome.result.rows.size),
        "cpu_s": outcome.cpu_s,
        "wall_s": outcome.run_s,
        "peak_rss_gib": (outcome.peak_rss_bytes or 0) / 2**30,
    }


def _unsharded(trace: str, replicas: int, requests: int) -> dict[str, Any]:
    from kvsim.run import run

    cpu = time.process_time()
    wall = time.perf_counter()
    outcome = run(_config(trace, replicas, requests))
    return {
        "requests": requests,
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "simulated_s": outcome.summary["simulated_s"],
    }


def _fresh(call: Any, *args: Any) -> Any:
    with ProcessPoolExecutor(1, max_tasks_per_child=1) as pool:
        return pool.submit(call, *args).result()


def main() -> None:
    from kvsim.resolve import resolve
    from kvsim.shard import Sharding
    from kvsim.shard.run import ShardedRun

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="a canonical Parquet trace")
    parser.add_argument("--replicas", type=int, default=256)
    parser.add_argument("--shards", type=int, default=128)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--sample", type=int, default=4, help="windows to run, spread out")
    parser.add_argument("--unsharded-requests", type=int, default=0, help="0: skip")
    parser.add_argument("--cores", default="2,32,128", help="cluster sizes to project to")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    resolved = resolve(_config(args.trace, args.replicas))
    cpu, wall = time.process_time(), time.perf_counter()
    sharded = ShardedRun.cut_file(resolved, Sharding(args.shards, args.warmup))
    if sharded is None:
        raise SystemExit(f"{args.trace}: not a canonical Parquet trace that can be read in slices")
    caller = {
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "requests": int(sharded.trace.arrival_s.size),
    }
    print(f"caller: re-timed and cut {caller['requests']:,} requests in {caller['wall_s']:.1f} s "
          f"({caller['peak_rss_gib']:.2f} GiB)", flush=True)  # fmt: skip
    tasks = sharded.tasks()
    picks = np.unique(np.linspace(0, len(tasks) - 1, args.sample).round().astype(int))
    windows = []
    try:
        for k in picks.tolist():
            figures = _fresh(_window, tasks[k])
            windows.append(figures)
            print(
                f"window {k + 1}/{len(tasks)}: {figures['counted']:,} requests, "
                f"{figures['cpu_s']:.1f} s CPU, {figures['peak_rss_gib']:.2f} GiB",
                flush=True,
            )
    finally:
        sharded.close()
    unsharded = None
    if args.unsharded_requests:
        unsharded = _fresh(_unsharded, args.trace, args.replicas, args.unsharded_requests)
        per = unsharded["cpu_s"] / unsharded["requests"]
        unsharded["projected_cpu_s"] = per * caller["requests"]
        print(f"unsharded: {unsharded['requests']:,} requests in {unsharded['cpu_s']:.1f} s CPU "
              f"({unsharded['peak_rss_gib']:.2f} GiB); the day projected: "
              f"{unsharded['projected_cpu_s'] / 3600:.1f} h", flush=True)  # fmt: skip
    cpu_s = np.array([w["cpu_s"] for w in windows])
    total = float(cpu_s.mean()) * len(tasks)
    projections = {}
    for cores in (int(c) for c in args.cores.split(",")):
        projections[cores] = caller["wall_s"] + max(float(cpu_s.max()), total / cores)
        print(f"projected on {cores} cores: {projections[cores] / 60:.1f} min "
              f"(caller {caller['wall_s']:.0f} s + windows)", flush=True)  # fmt: skip
    out = {
        "trace": args.trace,
        "replicas": args.replicas,
        "shards": args.shards,
        "warmup_s": args.warmup,
        "caller": caller,
        "windows": windows,
        "windows_cpu_s_projected": total,
        "unsharded": unsharded,
        "projected_s": projections,
        "projection": "caller wall + max(slowest sampled window, mean window x shards / cores)",
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=lambda v: None if not math.isfinite(v) else v)


if __name__ == "__main__":
    main()

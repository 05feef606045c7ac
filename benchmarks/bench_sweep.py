"""The sweep executors on 32 configurations of mooncake-conversation slices: serial, the local
pool, and Ray.

    python benchmarks/bench_sweep.py [--requests 300] [--jobs 2]

Each executor runs the same 32 configurations (policy × replicas × rate scale over the trace's
first N requests) into a fresh folder, results written as `kvsim sweep` writes them. Reports
wall seconds, the pool's speed-up over serial (-j 1), Ray's overhead against the pool (with
and without starting the local Ray), each worker's peak memory, and whether the three tables
are equal (they must be; the figures are what they are on this machine).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from kvsim.sweep import MEASURED_COLUMNS, expand_spec, open_executor, run_sweep


def spec(requests: int) -> dict[str, object]:
    return {
        "base": {"trace": "mooncake-conversation", "max_requests": requests},
        "grid": {
            "policy": ["lru", "s3fifo", "arc", "sieve"],
            "replicas": [1, 2],
            "rate_scale": [0.5, 1.0, 2.0, 4.0],
        },
    }


def timed(label: str, configurations, out: Path, executor) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    run_sweep(configurations, out, executor=executor, progress=False)
    seconds = time.perf_counter() - start
    table = pd.read_parquet(out / "results.parquet")
    peak = table["sweep.peak_rss_bytes"].max() / 2**20
    print(f"{label:<28} {seconds:7.1f} s   peak worker RSS {peak:,.0f} MiB", flush=True)
    return seconds, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per configuration")
    parser.add_argument("--jobs", type=int, default=2, help="workers for the pool and Ray")
    args = parser.parse_args()
    configurations = expand_spec(spec(args.requests), "bench")
    print(f"{len(configurations)} configurations, mooncake-conversation[:{args.requests}]")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        serial, a = timed("serial (-j 1)", configurations, root / "serial", "local")
        with open_executor("local", jobs=args.jobs) as pool:
            local, b = timed(f"local pool (-j {args.jobs})", configurations, root / "pool", pool)
        start = time.perf_counter()
        try:
            ray = open_executor("ray", jobs=args.jobs)
        except Exception as exc:  # no Ray installed: report the rest
            print(f"ray: not run ({exc})")
            ray = None
        if ray is not None:
            with ray:
                started = time.perf_counter() - start
                print(f"{'ray start-up':<28} {started:7.1f} s")
                in_ray, c = timed(f"ray (-j {args.jobs}, started)", configurations,
                                  root / "ray", ray)  # fmt: skip
        print(f"pool speed-up over serial: {serial / local:.2f}x on {args.jobs} workers")
        if ray is not None:
            print(
                f"ray overhead against the pool: {in_ray / local - 1:+.0%} once started, "
                f"{(in_ray + started) / local - 1:+.0%} with its start-up"
            )
        tables = [a, b] + ([c] if ray is not None else [])
        same = all(
            t.drop(columns=list(MEASURED_COLUMNS)).equals(a.drop(columns=list(MEASURED_COLUMNS)))
            for t in tables
        )
        print(f"tables equal apart from the measured columns: {same}")


if __name__ == "__main__":
    main()

"""`kvsim plan` on a mooncake-conversation slice at three rates: wall time and number of runs.

    python benchmarks/bench_plan.py                       # 1000 requests, 1x,2x,4x, -j 2
    python benchmarks/bench_plan.py --max-requests 2000 --executor ray -j 8

Runs the real CLI in a subprocess (as a user would), with --json and --out, and prints the
frontier, the runs, rounds and wall time as one JSON object plus a table. Asserts nothing: the
figures go in the README's Capacity planning section.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conversation")
    parser.add_argument("--max-requests", type=int, default=1000)
    parser.add_argument("--rates", default="1x,2x,4x")
    parser.add_argument("--slo-ttft-p99", default="10")
    parser.add_argument("--slo-tpot-p99", default="0.1")
    parser.add_argument("--executor", default="local")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--out", help="Keep plan.json and the plots here. [a temporary folder]")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) / "plan"
    command = [
        sys.executable, "-m", "kvsim", "plan", "--trace", args.trace,
        "--max-requests", str(args.max_requests), "--rates", args.rates,
        "--slo-ttft-p99", args.slo_ttft_p99, "--slo-tpot-p99", args.slo_tpot_p99,
        "--executor", args.executor, "--json", "--out", str(out), "--quiet",
    ]  # fmt: skip
    if args.executor != "serial":
        command += ["-j", str(args.jobs)]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"kvsim plan failed ({proc.returncode}): {proc.stderr.strip()}")
    doc = json.loads(proc.stdout)
    run_s = [e["wall_s"] for e in doc["evaluated"] if isinstance(e.get("wall_s"), float)]
    figures = {
        "trace": args.trace,
        "max_requests": args.max_requests,
        "rates": args.rates,
        "executor": args.executor,
        "jobs": args.jobs,
        "wall_s": round(wall, 1),
        "runs": doc["runs"],
        "rounds": doc["rounds"],
        "simulated_run_s_sum": round(sum(run_s), 1),
        "frontier": [
            {
                k: f[k]
                for k in (
                    "rate_label",
                    "rate",
                    "replicas",
                    "router",
                    "tiers",
                    "pd",
                    "ttft_p99_s",
                    "tpot_p99_s",
                    "cost_per_million_tokens_usd",
                )
            }
            for f in doc["frontier"]
        ],
        "out": str(out),
    }
    print(json.dumps(figures))
    for f in doc["frontier"]:
        print(f"{f['rate_label']}: {f['explanation']}")


if __name__ == "__main__":
    main()

"""Instructions the simulator executes per request: a speed figure this shared machine's noise
does not move, for comparing two versions of the hot path.

    python benchmarks/bench_instructions.py                    # 3,000 requests, 4 small replicas
    python benchmarks/bench_instructions.py --requests 6000 --json out.json
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_instructions.py   # another version

Why: CPU time here moves by a quarter within the hour (README, "How big runs grow"), so two
versions compare only side by side, and even then a few per cent is within the noise. Valgrind
counts the instructions a process executes: six runs of the same code came within 0.4 % of
each other (`PYTHONHASHSEED` is fixed; temporary paths still differ). Instructions are not
seconds, since cache misses and branches weigh too, but they follow the interpreter's work,
which is where this simulator spends its time.

The workload is the 1 M-request fleet run's late phase in miniature: LMSYS-shaped sessions on 4
replicas with HBM and DRAM small enough that HBM evicts to DRAM, and DRAM evicts, from the
first minutes. The child process draws the trace itself (seed 0) and runs once plain (to
write the bytecode caches), then twice under `valgrind --tool=cachegrind --cache-sim=no`, with
the simulation and without it (imports, drawing the trace, building the run); the difference is
the simulation's. Needs valgrind (Debian's package);
asserts nothing: the figures go in the README.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SESSIONS_PER_S_PER_REPLICA = 137.0 / 64  # the 1 M-request run's load on each of its replicas
_TOTAL = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)


def child(args: argparse.Namespace) -> None:
    """The measured process: draw the trace and build the run; simulate unless `--skip`."""
    from kvsim.engine import EngineConfig, simulate
    from kvsim.hardware import load_profile
    from kvsim.metrics import summarize
    from kvsim.models import kv_bytes_per_block, load_model
    from kvsim.traces import load_trace

    rate = SESSIONS_PER_S_PER_REPLICA * args.replicas
    trace = load_trace("lmsys", max_requests=args.requests, rate=rate, seed=0)
    model, profile = load_model("llama-3.1-8b"), load_profile("h100-sxm")
    config = EngineConfig(
        replicas=args.replicas,
        router="round-robin",
        num_gpu_blocks=args.gpu_blocks,
        tier_capacity=f"dram={args.dram_blocks * kv_bytes_per_block(model)}B",
    )
    if args.skip:
        return
    summary = summarize(simulate(trace, model, profile, config))
    dram = summary["tiers"]["dram"]
    figures = {k: summary[k] for k in ("requests", "prefix_hit_ratio", "ttft_p50_s")}
    figures |= {"evicted_from_hbm": summary["evicted_blocks"], "dram": dram}
    print(json.dumps(figures))


def run_child(args: argparse.Namespace, skip: bool, valgrind: list[str]) -> str:
    """What the child printed, run under `valgrind` (a command prefix, or none)."""
    command = [*valgrind, sys.executable, __file__, "--child", *(["--skip"] if skip else [])]
    command += ["--requests", str(args.requests), "--replicas", str(args.replicas)]
    command += ["--gpu-blocks", str(args.gpu_blocks), "--dram-blocks", str(args.dram_blocks)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        sys.exit(f"bench_instructions: the child failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def instructions(args: argparse.Namespace, skip: bool) -> tuple[int, str]:
    """(instructions the child executed, what it printed) under cachegrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cachegrind.out"
        cachegrind = ["--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"]
        printed = run_child(args, skip, ["valgrind", *cachegrind])
        found = _TOTAL.search(out.read_text())
        assert found, "cachegrind wrote no summary line"
        return int(found.group(1)), printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--gpu-blocks", type=int, default=3000, help="HBM blocks per replica")
    parser.add_argument(
        "--dram-blocks", type=int, default=6000, help="DRAM blocks per node, shared by its replicas"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.requests < 1:
        parser.error(f"--requests: expected at least 1, got {args.requests}")
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions: valgrind is not installed (Debian: apt install valgrind)")
    start = time.perf_counter()
    # once without valgrind first: modules compiled now are not counted below (a checkout's
    # first run writes its bytecode caches, which cost instructions no later run spends)
    run_child(args, skip=False, valgrind=[])
    with_run, printed = instructions(args, skip=False)
    without, _ = instructions(args, skip=True)
    import kvsim

    simulated = with_run - without
    point = {
        "code": str(Path(kvsim.__file__).parent.parent),
        "requests": args.requests,
        "replicas": args.replicas,
        "gpu_blocks": args.gpu_blocks,
        "dram_blocks": args.dram_blocks,
        "instructions": simulated,
        "instructions_per_request": round(simulated / args.requests),
        "startup_instructions": without,
        "result": json.loads(printed),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(point))
    if args.json:
        args.json.write_text(json.dumps(point, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Wall time of the same runs on two checkouts of kvsim, side by side, to show that a change of
structure did not slow the engine.

    git worktree add /tmp/kvsim-before <commit>
    python benchmarks/bench_checkouts.py /tmp/kvsim-before --rounds 3

Each round starts one process per checkout at the same moment (each imports its own `kvsim`
through PYTHONPATH), so a shared machine's slow spells slow both alike; the per-round ratio
(this checkout / the other) is what to read, with its median. Cases: the whole
mooncake-conversation replay (HBM only, as benchmarks/bench_replay.py) and the default runs of
sharegpt and lmsys (`kvsim run` with no options). Asserts nothing: the figures go in the docs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# each case prints its simulation's wall time (loading the trace excluded) as JSON
CASES = {
    "replay/mooncake-conversation": (
        "from kvsim.engine import EngineConfig, simulate\n"
        "from kvsim.hardware import load_profile\n"
        "from kvsim.models import load_model\n"
        "from kvsim.traces import load_trace\n"
        "t = load_trace('mooncake-conversation')\n"
        "r = simulate(t, load_model('llama-3.1-8b'), load_profile('h100-sxm'),"
        " EngineConfig(tiers='hbm'))\n"
        "print(json.dumps({'wall_s': r.wall_s, 'n': r.requests.num_rows}))\n"
    ),
    "default/sharegpt": (
        "from kvsim.run import RunConfig, run\n"
        "o = run(RunConfig(trace='sharegpt'))\n"
        "print(json.dumps({'wall_s': o.result.wall_s, 'n': o.result.requests.num_rows}))\n"
    ),
    "default/lmsys": (
        "from kvsim.run import RunConfig, run\n"
        "o = run(RunConfig(trace='lmsys'))\n"
        "print(json.dumps({'wall_s': o.result.wall_s, 'n': o.result.requests.num_rows}))\n"
    ),
}


def start(checkout: Path, code: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    return subprocess.Popen(
        [sys.executable, "-c", "import json\n" + code],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",  # neither checkout's folder: the import comes from PYTHONPATH alone
    )


def wall_s(proc: subprocess.Popen[str]) -> float:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"a run failed (exit {proc.returncode})")
    return float(json.loads(out.strip().splitlines()[-1])["wall_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its root folder)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="cases whose name contains this")
    args = parser.parse_args()
    for name, code in CASES.items():
        if args.only not in name:
            continue
        ratios, ours, theirs = [], [], []
        for _ in range(args.rounds):
            a, b = start(HERE, code), start(args.other, code)
            x, y = wall_s(a), wall_s(b)
            ours.append(x)
            theirs.append(y)
            ratios.append(x / y)
        print(
            f"{name:30s} this {min(ours):6.2f} s  other {min(theirs):6.2f} s (best of "
            f"{args.rounds})  ratio per round {', '.join(f'{r:.3f}' for r in ratios)}  "
            f"median {statistics.median(ratios):.3f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

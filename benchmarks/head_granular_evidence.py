"""Head-granular ema-head (issue 14) in numbers, for docs/policies.md.

    python benchmarks/head_granular_evidence.py engine TRACE[:BLOCKS[:REQUESTS]] ...
    python benchmarks/head_granular_evidence.py mrc TRACE ...

``engine``: one ``kvsim run`` per row (HBM only, BLOCKS HBM blocks, the first REQUESTS requests)
for lru, ema-head whole-block, and ema-head head-granular lossless and lossy (tolerate_loss
0.001); prints a Markdown table of hit ratio, TTFT p50/p99, lossy hits and attention mass lost
per request, and wall seconds. ``mrc``: the two head-granular rows of the evidence table
(benchmarks/policy_evidence.py) at its four capacities, as there (hit ratio, share of the
LRU→Belady gap), with lossy hits, attention mass lost per request and unserved requests.
Asserts nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kvsim.mrc import BlockSequence, next_use, replay
from kvsim.policies import make_policy
from kvsim.traces import load_trace

ROWS = {
    "lru": ("lru", ""),
    "ema-head (whole blocks)": ("ema-head", ""),
    "ema-head (head groups, lossless)": ("ema-head", "ema-head.head_granular=true"),
    "ema-head (head groups, loss ≤ 0.1 %)": (
        "ema-head",
        "ema-head.head_granular=true,ema-head.tolerate_loss=0.001",
    ),
}


def engine(spec: str) -> None:
    name, _, rest = spec.partition(":")
    blocks, _, requests = rest.partition(":")
    base = ["run", "--trace", name, "--tiers", "hbm"]
    base += ["--num-gpu-blocks", blocks] if blocks else []
    base += ["--max-requests", requests] if requests else []
    print(f"\n### {spec}: kvsim {' '.join(base)} --policy P\n")
    head = "| policy | hit ratio | TTFT p50 s | TTFT p99 s | lossy/req | mass lost/req | wall s |"
    print(head)
    print("|---|---|---|---|---|---|---|")
    for label, (policy, params) in ROWS.items():
        with tempfile.TemporaryDirectory() as out:
            args = [*base, "--policy", policy, "--out", out]
            args += [a for p in params.split(",") if p for a in ("--policy-param", p)]
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "kvsim", *args], check=True, capture_output=True)
            wall = time.perf_counter() - start
            s = json.loads((Path(out) / "summary.json").read_text())
        print(
            f"| {label} | {s['prefix_hit_ratio']:.4f} | {s['ttft_p50_s']:.3f} | "
            f"{s['ttft_p99_s']:.3f} | {s.get('lossy_hits_per_request', 0.0):.2f} | "
            f"{s.get('attention_mass_lost_per_request', 0.0):.2e} | {wall:.0f} |",
            flush=True,
        )


def mrc(name: str) -> None:
    loaded = load_trace(name)
    seq = BlockSequence.from_trace(loaded, loaded.native_block_size or 16)
    distinct = np.unique(seq.keys).size
    caps = sorted({max(16, int(distinct * f)) for f in (0.005, 0.02, 0.08, 0.3)})
    future = next_use(seq.keys)
    lru = [replay(seq, make_policy("lru"), c, "prefix").hit_ratio for c in caps]
    best = [replay(seq, make_policy("belady"), c, "prefix", future=future).hit_ratio for c in caps]
    print(f"\n### {name} (prefix; capacities {', '.join(map(str, caps))})\n")
    for label, params in (("ema-head", {}), ("ema-head (loss ≤ 0.1 %)", {"tolerate_loss": 0.001})):
        cells, notes = [], []
        for i, c in enumerate(caps):
            r = replay(seq, make_policy("ema-head", params), c, "prefix")
            gap = best[i] - lru[i]
            share = f"{(r.hit_ratio - lru[i]) / gap:+.0%}" if gap > 1e-12 else "="
            cells.append(f"{r.hit_ratio:.3f} ({share})")
            extra = r.extra or {}
            notes.append(
                f"{c}: lossy {extra['lossy_hits']}, mass {extra['attention_mass_lost']:.2e}, "
                f"unserved {extra['unserved_requests']}"
            )
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
        print(f"  {label}: " + "; ".join(notes), flush=True)


def main(argv: list[str]) -> None:
    mode, specs = argv[0], argv[1:]
    for spec in specs:
        (engine if mode == "engine" else mrc)(spec)


if __name__ == "__main__":
    main(sys.argv[1:])

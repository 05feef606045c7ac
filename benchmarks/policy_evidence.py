"""The evidence table and plots in docs/policies.md: every policy against Belady, per trace.

Usage: python benchmarks/policy_evidence.py [--semantics prefix] TRACE [TRACE ...]
Writes docs/mrc-<trace>.png and prints a Markdown table with each policy's share of the
LRU→Belady gap it closes ((policy − LRU) / (Belady − LRU)).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kvsim.mrc import BlockSequence, next_use, replay
from kvsim.mrc.cli import plot_mrc
from kvsim.policies import make_policy, policy_names
from kvsim.traces import load_trace

DOCS = Path(__file__).resolve().parents[1] / "docs"


def main(argv: list[str]) -> None:
    semantics = "prefix"
    if argv[:1] == ["--semantics"]:
        semantics, argv = argv[1], argv[2:]
    names = [n for n in policy_names() if not n.startswith("example-")]
    for trace in argv:
        loaded = load_trace(trace)
        seq = BlockSequence.from_trace(loaded, loaded.native_block_size or 16)
        distinct = np.unique(seq.keys).size
        caps = sorted({max(16, int(distinct * f)) for f in (0.005, 0.02, 0.08, 0.3)})
        future = next_use(seq.keys)
        results = [
            replay(seq, make_policy(n), c, semantics, future=future) for n in names for c in caps
        ]
        plot_mrc(results, str(DOCS / f"mrc-{trace}.png"), f"{trace} ({semantics})")
        ratio = {(r.policy, r.capacity): r.hit_ratio for r in results}
        print(f"\n### {trace} ({semantics}; {len(seq)} accesses, {distinct} distinct blocks)\n")
        print("| policy | " + " | ".join(f"{c} blocks" for c in caps) + " |")
        print("|---|" + "---|" * len(caps))
        for n in names:
            cells = []
            for c in caps:
                lru, opt, h = ratio[("lru", c)], ratio[("belady", c)], ratio[(n, c)]
                gap = (h - lru) / (opt - lru) if opt > lru else float("nan")
                cells.append(f"{h:.3f} ({gap:+.0%})")
            print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])

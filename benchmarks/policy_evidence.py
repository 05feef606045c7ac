"""The evidence table and plots in docs/policies.md: every policy against Belady, per trace.

Usage: python benchmarks/policy_evidence.py [--semantics prefix] TRACE [TRACE ...]
Writes docs/mrc-<trace>.png and prints a Markdown table with each policy's share of the
LRU→Belady gap it closes ((policy − LRU) / (Belady − LRU); '=' where LRU already equals Belady).
Besides the registered policies it runs two ema-head variants: whole blocks (as in the engine)
and head-granular with lossy hits allowed (``tolerate_loss``), whose attention mass lost it
prints below the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kvsim.mrc import BlockSequence, ReplayResult, next_use, replay
from kvsim.policies import make_policy, policy_names
from kvsim.traces import load_trace

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: Extra rows: label -> (policy, params).
VARIANTS = {
    "ema-head (whole blocks)": ("ema-head", {"head_granular": False}),
    "ema-head (loss ≤ 0.1 %)": ("ema-head", {"tolerate_loss": 0.001}),
}


def plot(results: list[ReplayResult], path: Path, title: str) -> None:
    """One line per policy, each with its own colour, line style and marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.policy for r in results))
    colours = plt.get_cmap("tab20").colors
    styles, markers = ["-", "--", "-.", ":"], "osD^v<>phX*"
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, name in enumerate(names):
        rows = sorted((r.capacity, r.hit_ratio) for r in results if r.policy == name)
        style = {
            "color": colours[i % len(colours)],
            "linestyle": styles[i % len(styles)],
            "marker": markers[i % len(markers)],
            "linewidth": 1.3,
        }
        if name == "belady":
            style.update(color="black", linestyle="--", linewidth=2.5, marker="o")
        elif name in ("lru", "bayes-reuse"):
            style.update(linewidth=2.5)
        ax.plot([c for c, _ in rows], [h for _, h in rows], label=name, **style)
    ax.set_xscale("log")
    ax.set_xlabel("capacity (blocks)")
    ax.set_ylabel("hit ratio (per block access)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    semantics = "prefix"
    if argv[:1] == ["--semantics"]:
        semantics, argv = argv[1], argv[2:]
    runs = {n: (n, {}) for n in policy_names() if not n.startswith("example-")}
    runs.update(VARIANTS)
    for trace in argv:
        loaded = load_trace(trace)
        seq = BlockSequence.from_trace(loaded, loaded.native_block_size or 16)
        distinct = np.unique(seq.keys).size
        caps = sorted({max(16, int(distinct * f)) for f in (0.005, 0.02, 0.08, 0.3)})
        future = next_use(seq.keys)
        results = []
        for label, (name, params) in runs.items():
            for c in caps:
                r = replay(seq, make_policy(name, params), c, semantics, future=future)
                results.append(ReplayResult(label, c, semantics, r.accesses, r.hits, r.extra))
        plot(results, DOCS / f"mrc-{trace}.png", f"{trace} ({semantics})")
        by = {(r.policy, r.capacity): r for r in results}
        print(f"\n### {trace} ({semantics}; {len(seq)} accesses, {distinct} distinct blocks)\n")
        print("| policy | " + " | ".join(f"{c} blocks" for c in caps) + " |")
        print("|---|" + "---|" * len(caps))
        for label in runs:
            cells = []
            for c in caps:
                lru, opt = by[("lru", c)].hit_ratio, by[("belady", c)].hit_ratio
                h = by[(label, c)].hit_ratio
                gap = f"{(h - lru) / (opt - lru):+.0%}" if opt - lru > 1e-9 else "="
                cells.append(f"{h:.3f} ({gap})")
            print(f"| {label} | " + " | ".join(cells) + " |")
        lossy = [by[("ema-head (loss ≤ 0.1 %)", c)].extra or {} for c in caps]
        print(
            "\nema-head (loss ≤ 0.1 %): attention mass lost per request "
            + ", ".join(f"{e.get('attention_mass_lost', 0):.2e}" for e in lossy)
            + "; lossy hits "
            + ", ".join(str(e.get("lossy_hits", 0)) for e in lossy)
        )


if __name__ == "__main__":
    main(sys.argv[1:])

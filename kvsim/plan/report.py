"""A plan's outputs: the frontier table, its JSON, and two plots.

The plots: $/M tokens of each rate's winner against the rate (where capacity gets cheaper or
dearer per token as load grows), and TTFT p99 against $/M tokens over every run of the plan with
each rate's Pareto front (what each step of latency costs at that load; runs at different loads
are not alternatives to each other, so they get a front each).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvsim.plan.planner import Evaluation, PlanResult
from kvsim.run import json_safe
from kvsim.units import format_bytes


def _tiers_text(tiers: dict[str, int] | None) -> str:
    if not tiers:
        return "hbm only"
    return ", ".join(f"{name} {format_bytes(size)}" for name, size in tiers.items())


def format_frontier(result: PlanResult) -> str:
    """The frontier as a table, one explanation line per rate, and the run count."""
    head = ("rate", "req/s", "replicas", "router", "tiers (per node; rdma: pool)", "P/D",
            "TTFT p99", "TPOT p99", "goodput tok/s", "$/M tok")  # fmt: skip
    rows = []
    for p in result.frontier:
        d = p.as_dict()
        if not d["feasible"]:
            rows.append((p.rate.label, f"{p.rate.requests_per_s:.3g}", "-", "-", "-", "-", "-",
                         "-", "-", "none meets"))  # fmt: skip
            continue
        rows.append(
            (
                p.rate.label,
                f"{p.rate.requests_per_s:.3g}",
                str(d["replicas"]),
                d["router"],
                _tiers_text(d["tiers"]),
                d["pd"] or "-",
                f"{d['ttft_p99_s']:.2f} s",
                f"{d['tpot_p99_s'] * 1000:.0f} ms"
                if isinstance(d["tpot_p99_s"], float) and math.isfinite(d["tpot_p99_s"])
                else "n/a",
                f"{d['goodput_tokens_per_s']:,.0f}",
                f"${d['cost_per_million_tokens_usd']:.3f}",
            )
        )
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [head, *rows]]  # fmt: skip
    lines.append("")
    lines += [f"{p.rate.label}: {p.explanation}" for p in result.frontier]
    lines.append("")
    lines.append(
        f"{result.runs} runs in {result.rounds} rounds, {result.wall_s:,.1f} s "
        f"(SLOs: TTFT p99 <= {result.settings.slo_ttft_p99_s:g} s, "
        f"TPOT p99 <= {result.settings.slo_tpot_p99_s:g} s)"
    )
    return "\n".join(lines)


def plan_json(result: PlanResult, indent: int | None = None) -> str:
    """The plan as strict JSON (NaN and infinities as null)."""
    return json.dumps(json_safe(result.as_dict()), indent=indent, allow_nan=False)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (lower is better), by x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(set(points)):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def _finite(e: Evaluation, key: str) -> float | None:
    v = e.summary.get(key)
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def write_plots(result: PlanResult, out: Path) -> list[Path]:
    """cost_vs_rate.png and ttft_pareto.png in `out` (an existing folder)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [out / "cost_vs_rate.png", out / "ttft_pareto.png"]
    feasible = [p for p in result.frontier if p.winner is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = [p.rate.requests_per_s for p in feasible]
    ys = [p.winner.cost for p in feasible if p.winner is not None]
    ax.plot(xs, ys, marker="o")
    for p in feasible:
        assert p.winner is not None
        d = p.winner.deployment
        split = f", P/D {d.pd[0]}:{d.pd[1]}" if d.pd else ""
        ax.annotate(
            f"{p.rate.label}: {d.replicas}× {d.router}{split}",
            (p.rate.requests_per_s, p.winner.cost),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=8,
        )
    missing = [p.rate.label for p in result.frontier if p.winner is None]
    title = "Cheapest deployment meeting the SLOs"
    ax.set_title(title + (f" (none meets at {', '.join(missing)})" if missing else ""), fontsize=10)
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("$ per million tokens")
    ax.set_ylim(bottom=0, top=max(ys, default=1.0) * 1.2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    cmap = plt.get_cmap("viridis")
    rates = sorted({e.rate for e in result.evaluations}, key=lambda r: r.rate_scale)
    for k, rate in enumerate(rates):
        pts = [
            (c, t)
            for e in result.evaluations
            if e.rate == rate
            and (c := _finite(e, "cost_per_million_tokens_usd")) is not None
            and (t := _finite(e, "ttft_p99_s")) is not None
        ]
        if not pts:
            continue
        color = cmap(k / max(len(rates) - 1, 1))
        ax.scatter(*zip(*pts, strict=True), s=14, alpha=0.5, color=color, label=rate.label)
        front = pareto_front(pts)
        ax.step(*zip(*front, strict=True), where="post", color=color, lw=1.2)
    for p in feasible:
        assert p.winner is not None
        ax.scatter([p.winner.cost], [p.winner.summary["ttft_p99_s"]], marker="*", s=120,
                   color="red", zorder=3)  # fmt: skip
    ax.axhline(result.settings.slo_ttft_p99_s, ls="--", color="grey", lw=1, label="TTFT SLO")
    ax.set_yscale("log")
    ax.set_xlabel("$ per million tokens")
    ax.set_ylabel("TTFT p99 (s)")
    ax.set_title(
        f"All {result.runs} runs: Pareto front per rate (lines), winners (stars)", fontsize=10
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths

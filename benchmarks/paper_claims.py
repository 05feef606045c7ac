"""The predictive multi-tier paper's replay claims (arXiv 2604.26968) on bigger trace slices.

notebooks/paper_claims.ipynb runs a few hundred requests per trace to finish in about a minute;
this script runs the same comparison on kvsim's default slices (agentic 1,210 requests,
mooncake-toolagent 1,500, mooncake-conversation 1,000, pi-coding-agent 17), through the public
API (`kvsim.compare.compare` on a local pool), and prints Markdown tables:

- the paper's system (bayes-reuse + all six tiers + prefetch + RoPE reuse) against its baseline
  (LRU over HBM + DRAM, no prefetch, no RoPE reuse), one Llama-3.1-8B replica on an H100, on two
  nodes: the h100-sxm profile as shipped, and a scaled node (HBM = 1.25 x the slice's largest
  request, every tier below scaled by the same factor; the notebook explains why);
- the ablation: each of the four parts alone on the baseline, and all but the predictor.

    python benchmarks/paper_claims.py                   # tables on stdout (~10 min on 2 cores)
    python benchmarks/paper_claims.py --update-doc      # rewrite docs/paper-claims.md's block
    python benchmarks/paper_claims.py --whole           # mooncake-conversation's 12,031 requests,
                                                        # shipped node, 3 configurations (~25 min)
    python benchmarks/paper_claims.py --at-slo          # each slice at 4x its rate on the fleet
                                                        # `kvsim plan` finds for the baseline

A saturated replica measures its queue, not its cache; `--at-slo` serves each slice where the
baseline meets a TTFT p99 SLO of 2 s and a TPOT p99 of 100 ms (the same operating point as
benchmarks/policy_end_to_end.py): kvsim plan picks the cheapest fleet of shipped nodes (replicas,
router) for the baseline at that load, and the ablation runs on that fleet.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kvsim
from kvsim.capacity import profile_capacity_report
from kvsim.compare import Row, compare
from kvsim.engine import EngineConfig
from kvsim.hardware import load_profile
from kvsim.models import load_model
from kvsim.run import RunConfig
from kvsim.sweep import Executor, open_executor
from kvsim.traces import load_trace
from kvsim.traces.stats import reuse_ceiling

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "paper-claims.md"

SLICES = {
    "agentic": 1210,
    "mooncake-toolagent": 1500,
    "mooncake-conversation": 1000,
    "pi-coding-agent": 17,
}
WHOLE = ("mooncake-conversation", 12031)
BLOCK = 16
#: HBM of the scaled node, as a multiple of the slice's largest request (our choice: the
#: smallest node that serves every request, with a quarter to spare).
SCALED_HEADROOM = 1.25
BASELINE: dict[str, Any] = {"policy": "lru", "tiers": "hbm,dram", "prefetch": False,
                            "rope_reuse": False}  # fmt: skip
SYSTEM: dict[str, Any] = {"policy": "bayes-reuse", "tiers": "all", "prefetch": True,
                          "rope_reuse": True}  # fmt: skip
PARTS = {"bayes-reuse": "policy", "six tiers": "tiers", "prefetch": "prefetch",
         "RoPE reuse": "rope_reuse"}  # fmt: skip
LOWER = ("cxl", "nvme", "rdma", "pfs")


def scaled_node(trace: str, n: int) -> dict[str, Any]:
    """EngineConfig overrides of the scaled node for the first `n` requests of `trace`."""
    profile = load_profile("h100-sxm")
    full = profile_capacity_report(load_model("llama-3.1-8b"), profile)["kv_blocks"]
    t = load_trace(trace, max_requests=n).table
    need = (t.column("input_tokens").to_numpy() + t.column("output_tokens").to_numpy()).max()
    blocks = min(full, round(SCALED_HEADROOM * -(-int(need) // BLOCK)))
    f = blocks / full
    tiers = ",".join(
        f"{t.name}={int(t.capacity_bytes * f)}B" for t in profile.tiers if t.name != "hbm"
    )
    return {"num_gpu_blocks": blocks, "tier_capacity": tiers}


def config(trace: str, n: int, node: Mapping[str, Any], settings: Mapping[str, Any]) -> RunConfig:
    run = {k: node[k] for k in RUN_KEYS if k in node}
    engine = {k: v for k, v in node.items() if k not in RUN_KEYS}
    return RunConfig(trace=trace, max_requests=n, engine=EngineConfig(**settings, **engine), **run)


#: Node overrides that are the run's, not the engine's (the operating point's load and SLOs).
RUN_KEYS = ("rate_scale", "slo_ttft_s", "slo_tpot_s")
SLO_TTFT_P99_S, SLO_TPOT_P99_S = 2.0, 0.1  # as benchmarks/policy_end_to_end.py
AT_SLO_RATE = "4x"
AT_SLO_ROUTERS = ("round-robin", "dynamo-kv")


def slo_fleet(trace: str, n: int) -> tuple[dict[str, Any] | None, str]:
    """Overrides putting the baseline on the cheapest shipped-node fleet that meets the SLOs at
    `AT_SLO_RATE` (kvsim plan, tiers as the baseline's: hbm + dram), and its label."""
    from kvsim.plan import PlanSettings, parse_rates, resolve_rates, run_plan, serial_runner
    from kvsim.plan.rates import trace_rate_per_s

    base = config(trace, n, {}, BASELINE)
    settings = PlanSettings(base, SLO_TTFT_P99_S, SLO_TPOT_P99_S, routers=AT_SLO_ROUTERS,
                            pd_shares=(), search_tiers=())  # fmt: skip
    rate = resolve_rates(parse_rates(AT_SLO_RATE),
                         trace_rate_per_s(load_trace(trace, max_requests=n)))  # fmt: skip
    winner = run_plan(settings, rate, serial_runner).frontier[0].winner
    if winner is None:
        return None, (f"no baseline fleet of up to {settings.max_replicas} shipped nodes meets "
                      f"the SLOs at {AT_SLO_RATE} load")  # fmt: skip
    d = winner.deployment
    overrides = {"replicas": d.replicas, "router": d.router, "rate_scale": rate[0].rate_scale,
                 "slo_ttft_s": SLO_TTFT_P99_S, "slo_tpot_s": SLO_TPOT_P99_S}  # fmt: skip
    return overrides, f"{AT_SLO_RATE} load, {d.replicas} × shipped, {d.router}"


def ablation(
    trace: str, n: int, node: Mapping[str, Any], ex: Executor, parts: bool = True
) -> dict[str, Row]:
    """The paper's system, all but its predictor, the baseline and (with `parts`) each part
    alone on the baseline, by label."""
    table = compare(
        config(trace, n, node, SYSTEM),
        {"policy": ["bayes-reuse", "lru"]},
        baseline=BASELINE,
        executor=ex,
    )
    rows = {
        "paper's system": table.rows[0],
        "all but bayes-reuse": table.rows[1],
        "baseline": table.rows[2],
    }
    if parts:
        for label, key in PARTS.items():
            alone = compare(
                config(trace, n, node, BASELINE),
                {key: [SYSTEM[key]]},
                baseline={key: BASELINE[key]},
                executor=ex,
            )
            rows[f"+{label} alone"] = alone.rows[0]
    return rows


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def headline_row(trace: str, node: str, n: int, ceiling: float, rows: Mapping[str, Row]) -> str:
    base, system = rows["baseline"].figures, rows["paper's system"].figures
    ratios = rows["paper's system"].ratios
    below = sum(system.get(f"hit_ratio.{t}") or 0.0 for t in LOWER)
    ttft50, ttft99 = ratios["ttft_p50_s"], ratios["ttft_p99_s"]
    cost = ratios["cost_per_million_tokens_usd"]
    return (
        f"| {trace} | {node} | {n} | {ceiling:.3f} "
        f"| {base['prefix_hit_ratio']:.3f} → {system['prefix_hit_ratio']:.3f} ({below:.3f}) "
        f"| {_num(base['ttft_p50_s'], '{:.3g}')} → {_num(system['ttft_p50_s'], '{:.3g}')} s "
        f"({_num(1 / ttft50 if ttft50 else None, '{:.2f}')}×) "
        f"| {_num(1 / ttft99 if ttft99 else None, '{:.2f}')}× "
        f"| {base['throughput_tokens_per_s']:.0f} → {system['throughput_tokens_per_s']:.0f} "
        f"({_num(ratios['throughput_tokens_per_s'], '{:.2f}')}×) "
        f"| {base['cost_per_million_tokens_usd']:.4f} → "
        f"{system['cost_per_million_tokens_usd']:.4f} "
        f"({_num(100 * (1 - cost) if cost else None, '{:+.1f}')} %) |"
    )


HEADLINE_HEAD = (
    "| trace | node | requests | reuse ceiling | hit ratio baseline → system (system's hits "
    "below DRAM) | TTFT p50 baseline → system (× lower) | TTFT p99 × lower "
    "| output tok/s baseline → system (×) | $/M tokens baseline → system (% lower) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
ORDER = [
    "+bayes-reuse alone",
    "+six tiers alone",
    "+prefetch alone",
    "+RoPE reuse alone",
    "all but bayes-reuse",
    "paper's system",
]


def ablation_row(trace: str, node: str, rows: Mapping[str, Row]) -> str:
    base = rows["baseline"].figures["prefix_hit_ratio"] or 0.0
    cells = []
    for label in ORDER:
        row = rows[label]
        delta = (row.figures["prefix_hit_ratio"] or 0.0) - base
        cells.append(f"{delta:+.3f} / {_num(row.ratios['ttft_p50_s'], '{:.2f}')}×")
    return f"| {trace} | {node} | " + " | ".join(cells) + " |"


ABLATION_HEAD = "| trace | node | " + " | ".join(ORDER) + " |\n|---|---|" + "---|" * len(ORDER)


def provenance() -> str:
    """The kvsim the figures came from: version, commit, and whether kvsim/ was edited."""

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True)
        except OSError:
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "kvsim", "hardware_profiles")
    return f"kvsim {kvsim.__version__} at {head}" + (
        " plus uncommitted changes to kvsim/ or hardware_profiles/" if dirty else ""
    )


def run_slices(slices: Mapping[str, int], jobs: int, at_slo: bool = False) -> str:
    heads, abls, walls = [], [], []
    source = provenance()  # the code the runs use: other sessions may commit while they run
    start = time.perf_counter()
    nodes = ("at-slo",) if at_slo else ("shipped", "scaled")
    with open_executor("local", jobs=jobs) as ex:
        for trace, n in slices.items():
            ceiling = reuse_ceiling(load_trace(trace, max_requests=n), BLOCK)[0]
            for node in nodes:
                t0 = time.perf_counter()
                if node == "at-slo":
                    fleet, label = slo_fleet(trace, n)
                    if fleet is None:
                        heads.append(f"| {trace} | {label} | {n} | | | | | | |")
                        continue
                    overrides = fleet
                elif node == "scaled":
                    overrides = scaled_node(trace, n)
                    label = f"scaled ({overrides['num_gpu_blocks']:,} HBM blocks)"
                else:
                    overrides, label = {}, node
                rows = ablation(trace, n, overrides, ex)
                walls.append(f"{trace} {node} {time.perf_counter() - t0:.0f} s")
                print(f"  {walls[-1]}", file=sys.stderr)
                heads.append(headline_row(trace, label, n, ceiling, rows))
                abls.append(ablation_row(trace, label, rows))
    total = time.perf_counter() - start
    return "\n".join([
        f"Generated by `python benchmarks/paper_claims.py -j {jobs}"
        f"{' --at-slo' if at_slo else ''}` from {source}: "
        f"{total / 60:.1f} min wall on this 2-core machine ({'; '.join(walls)}).",
        "",
        HEADLINE_HEAD,
        *heads,
        "",
        "Ablation (cell: prefix hit ratio minus the baseline's / TTFT p50 as a multiple of the "
        "baseline's; below 1× is faster):",
        "",
        ABLATION_HEAD,
        *abls,
    ])  # fmt: skip


def run_whole(jobs: int) -> str:
    trace, n = WHOLE
    source = provenance()
    start = time.perf_counter()
    ceiling = reuse_ceiling(load_trace(trace, max_requests=n), BLOCK)[0]
    with open_executor("local", jobs=jobs) as ex:
        rows = ablation(trace, n, {}, ex, parts=False)
    total = time.perf_counter() - start
    lines = [
        f"Generated by `python benchmarks/paper_claims.py --whole -j {jobs}` from "
        f"{source}: {total / 60:.1f} min wall.",
        "",
        HEADLINE_HEAD,
        headline_row(trace, "shipped", n, ceiling, rows),
        "",
        "| configuration | hit ratio (hbm / dram / cxl / nvme) | TTFT p50 | TTFT p99 "
        "| output tok/s | $/M tokens |",
        "|---|---|---|---|---|---|",
    ]
    for label in ("baseline", "all but bayes-reuse", "paper's system"):
        f = rows[label].figures
        tiers = " / ".join(f"{f.get(f'hit_ratio.{t}') or 0.0:.3f}"
                           for t in ("hbm", "dram", "cxl", "nvme"))  # fmt: skip
        lines.append(
            f"| {label} | {f['prefix_hit_ratio']:.3f} ({tiers}) | {f['ttft_p50_s']:.1f} s "
            f"| {f['ttft_p99_s']:.1f} s | {f['throughput_tokens_per_s']:.0f} "
            f"| {f['cost_per_million_tokens_usd']:.4f} |"
        )
    return "\n".join(lines)


def update_doc(name: str, text: str, path: Path = DOC) -> None:
    """Replace the block between this name's markers, re-reading the file just before."""
    begin = f"<!-- paper_claims.py {name}: generated below, do not edit by hand -->"
    end = f"<!-- paper_claims.py {name}: generated above -->"
    doc = path.read_text(encoding="utf-8")
    i, j = doc.find(begin), doc.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"{path}: markers {begin!r} ... {end!r} not found")
    path.write_text(doc[: i + len(begin)] + "\n\n" + text + "\n\n" + doc[j:], encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--only", default="", help="comma-separated traces (default: all four slices)"
    )
    parser.add_argument(
        "--whole", action="store_true", help="mooncake-conversation's whole trace instead"
    )
    parser.add_argument(
        "--at-slo", action="store_true", help="each slice where the baseline meets the SLOs"
    )
    parser.add_argument(
        "--update-doc", action="store_true", help="rewrite docs/paper-claims.md's block"
    )
    args = parser.parse_args(argv)
    if args.whole:
        text = run_whole(args.jobs)
    else:
        only = [t for t in args.only.split(",") if t]
        unknown = [t for t in only if t not in SLICES]
        if unknown:
            parser.error(f"--only: unknown trace {unknown[0]!r}; valid: {', '.join(SLICES)}")
        chosen = {t: n for t, n in SLICES.items() if not only or t in only}
        text = run_slices(chosen, args.jobs, args.at_slo)
    print(text)
    if args.update_doc:
        update_doc("whole" if args.whole else "at-slo" if args.at_slo else "slices", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay published vLLM / SGLang / TensorRT-LLM serving runs through kvsim and report the error.

Issue 11 asks how far kvsim's served TTFT, TPOT/ITL, E2E and throughput are from real engines.
Each point of ``benchmarks/validation_data/serving.toml`` is a published measurement with its
configuration (GPU, model, TP, dtypes, lengths or data set, arrival rate or concurrency); this
script builds the same workload as a canonical trace, runs it through kvsim's public API
(``kvsim.engine.simulate``, so it measures whatever the cost model is today), and prints the
signed error ``(kvsim - measured) / measured`` per point and per metric.

Fit and held-out halves. Points are sorted by id within each source and alternate fit, held-out,
fit, ... The one overhead term fitted here is the per-request serving overhead (API server,
tokenization, scheduling, detokenization): the median over fit-half points below saturation of
``measured TTFT - kvsim TTFT without it``. The profile may already carry it as
``[efficiency] request_overhead_s`` (read with getattr, so the script runs before and after the
cost model has the field); "without it" subtracts the profile's value from kvsim's TTFT and E2E.
The report gives every metric twice: kvsim as it is now, and kvsim with the fitted overhead in
place of the profile's, each with median and worst |error| on the fit half and the held-out half
separately. Only the held-out half says how well the fitted model predicts.

    python benchmarks/validate_serving.py                  # table on stdout (~1 min on 2 cores)
    python benchmarks/validate_serving.py --fit            # also the profile line to paste
    python benchmarks/validate_serving.py --out runs/val   # plus points.csv and report.md
    python benchmarks/validate_serving.py --update-doc     # rewrite the generated block of
                                                           # docs/validation.md's served section
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import kvsim
from kvsim.engine.config import EngineConfig
from kvsim.engine.simulation import simulate
from kvsim.hardware import load_profile
from kvsim.models import load_model
from kvsim.traces.schema import Trace, make_trace_table

HERE = Path(__file__).resolve().parent
DATA = HERE / "validation_data" / "serving.toml"
DOC = HERE.parent / "docs" / "validation.md"
DOC_BEGIN = "<!-- validate_serving.py: generated below, do not edit by hand -->"
DOC_END = "<!-- validate_serving.py: generated above -->"

#: Metrics a point may publish, in report order: (field in the data, label).
METRICS: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT"),
    ("tpot_s", "TPOT"),
    ("itl_s", "ITL"),
    ("e2e_s", "E2E"),
    ("output_throughput_tokens_per_s", "throughput"),
)
#: Metrics the per-request overhead shifts (it is paid once per request, before the first token).
OVERHEAD_METRICS = frozenset({"ttft_s", "e2e_s"})
REQUIRED = ("id", "source", "engine", "gpu", "model", "tp", "weight_dtype", "kv_dtype")
REQUIRED += ("workload", "arrival", "below_saturation", "quote")
ARRIVALS = ("poisson", "concurrency", "offline")
WORKLOADS = ("fixed", "sharegpt")
#: Goal of issue 11: median |error| at most this, and no point below saturation beyond WORST_GOAL.
MEDIAN_GOAL, WORST_GOAL = 0.10, 0.25


@dataclass(frozen=True)
class Point:
    """One published measurement and the configuration needed to replay it."""

    id: str
    source: str
    engine: str
    gpu: str
    model: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    workload: str
    arrival: str
    below_saturation: bool
    quote: str
    measured: dict[str, float]
    statistic: str = "median"
    input_tokens: int = 0
    output_tokens: int = 0
    rate_per_s: float = 0.0
    concurrency: int = 0
    num_prompts: int | None = None
    num_scheduler_steps: int = 1  # vLLM v0 multi-step scheduling, as the source ran it

    @property
    def load(self) -> str:
        """The offered load as the source states it."""
        if self.arrival == "poisson":
            return f"{self.rate_per_s:g} req/s"
        if self.arrival == "concurrency":
            return f"conc {self.concurrency}"
        return "offline"

    @property
    def lengths(self) -> str:
        if self.workload == "fixed":
            return f"{self.input_tokens}/{self.output_tokens}"
        return self.workload


@dataclass(frozen=True)
class ShareGPT:
    """ShareGPT lengths as the benchmark scripts sample them (see ``[workloads.sharegpt]``)."""

    input_mean_tokens: float
    output_mean_tokens: float
    cv: float
    min_tokens: int
    max_input_tokens: int
    max_total_tokens: int


@dataclass
class Dataset:
    points: list[Point]
    sources: dict[str, dict[str, Any]]
    sharegpt: ShareGPT | None


@dataclass
class Result:
    """kvsim's figures for one point: as simulated, and with the profile's overhead removed."""

    point: Point
    kvsim: dict[str, float]
    raw: dict[str, float]  # kvsim minus the profile's request overhead (TTFT, E2E)
    requests: int
    wall_s: float
    half: str = ""
    fitted: dict[str, float] = field(default_factory=dict)  # raw plus the fitted overhead


# -- data ------------------------------------------------------------------------------------------
def load_dataset(path: Path = DATA) -> Dataset:
    """Read and check the data file; a missing field names the point and the field."""
    with path.open("rb") as f:
        doc = tomllib.load(f)
    sources = doc.get("sources", {})
    points = []
    for raw in doc.get("points", []):
        where = raw.get("id", "<no id>")
        for key in REQUIRED:
            if key not in raw:
                raise ValueError(f"{path.name}: point {where}: missing {key}")
        if raw["source"] not in sources or "url" not in sources[raw["source"]]:
            raise ValueError(f"{path.name}: point {where}: source {raw['source']!r} has no url")
        if raw["arrival"] not in ARRIVALS or raw["workload"] not in WORKLOADS:
            raise ValueError(f"{path.name}: point {where}: unknown arrival or workload")
        measured = {m: float(raw[m]) for m, _ in METRICS if m in raw}
        if not measured:
            raise ValueError(f"{path.name}: point {where}: no published metric")
        needs = {"poisson": "rate_per_s", "concurrency": "concurrency"}.get(raw["arrival"])
        if needs and needs not in raw:
            raise ValueError(f"{path.name}: point {where}: {raw['arrival']} needs {needs}")
        if raw["workload"] == "fixed" and not (
            raw.get("input_tokens") and raw.get("output_tokens")
        ):
            raise ValueError(f"{path.name}: point {where}: fixed workload needs both lengths")
        fields = {k: raw[k] for k in Point.__dataclass_fields__ if k in raw and k != "measured"}
        points.append(Point(measured=measured, **fields))
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path.name}: duplicate point ids")
    share = doc.get("workloads", {}).get("sharegpt")
    sharegpt = ShareGPT(**{k: v for k, v in share.items() if k != "source_url"}) if share else None
    return Dataset(points, sources, sharegpt)


def split_halves(points: Sequence[Point]) -> dict[str, str]:
    """id -> "fit" or "held-out": alternate over sorted ids within each source.

    Alternating inside each source keeps both halves spread over engines, GPUs and loads, and a
    point keeps its half when others are added elsewhere in the file.
    """
    halves: dict[str, str] = {}
    by_source: dict[str, list[str]] = {}
    for p in points:
        by_source.setdefault(p.source, []).append(p.id)
    for ids in by_source.values():
        for i, pid in enumerate(sorted(ids)):
            halves[pid] = "fit" if i % 2 == 0 else "held-out"
    return halves


# -- workload --------------------------------------------------------------------------------------
def request_count(point: Point, max_requests: int) -> int:
    """Requests to replay: the published count, or 10 x concurrency (at least 100), capped."""
    n = point.num_prompts
    if n is None:
        n = max(10 * point.concurrency, 100)
    return max(1, min(n, max_requests))


def sharegpt_lengths(spec: ShareGPT, n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Lognormal input and output lengths with the published means, filtered as the scripts do."""
    sigma = math.sqrt(math.log1p(spec.cv**2))

    def draw(mean: float, k: int) -> np.ndarray:
        return np.rint(rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, k)).astype(np.int64)

    inputs: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    kept = 0
    while kept < n:
        a, b = draw(spec.input_mean_tokens, 2 * n), draw(spec.output_mean_tokens, 2 * n)
        ok = (a >= spec.min_tokens) & (b >= spec.min_tokens) & (a <= spec.max_input_tokens)
        ok &= a + b <= spec.max_total_tokens
        inputs.append(a[ok])
        outputs.append(b[ok])
        kept += int(ok.sum())
    return np.concatenate(inputs)[:n], np.concatenate(outputs)[:n]


def build_trace(point: Point, n: int, sharegpt: ShareGPT | None, seed: int = 0) -> Trace:
    """The point's workload as a canonical trace: fresh content per request, so nothing is shared.

    Poisson arrivals at the published rate; offline puts every request at time 0; a closed loop
    of concurrency C is C sessions whose next turn is issued the moment the previous finishes
    (think time 0), each turn with new content.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E2F]))
    if point.workload == "fixed":
        inputs = np.full(n, point.input_tokens, dtype=np.int64)
        outputs = np.full(n, point.output_tokens, dtype=np.int64)
    else:
        if sharegpt is None:
            raise ValueError(f"{point.id}: sharegpt workload but no [workloads.sharegpt] table")
        inputs, outputs = sharegpt_lengths(sharegpt, n, rng)
    think = None
    session = np.arange(n)
    turn = np.zeros(n, dtype=np.int64)
    if point.arrival == "poisson":
        arrival = np.cumsum(rng.exponential(1.0 / point.rate_per_s, n))
    elif point.arrival == "offline":
        arrival = np.zeros(n)
    else:
        c = max(1, min(point.concurrency, n))
        session, turn = np.arange(n) % c, np.arange(n) // c
        arrival = turn.astype(np.float64)  # nominal only: later turns follow their predecessor
        think = np.where(turn > 0, 0.0, np.nan)
    table = make_trace_table(
        request_id=np.arange(n),
        session_id=session,
        turn=turn,
        arrival_s=arrival,
        think_time_s=think,
        input_tokens=inputs,
        output_tokens=outputs,
        seg_offsets=np.arange(n + 1),
        seg_hashes=np.arange(1, n + 1, dtype=np.uint64),
        seg_tokens=inputs,
        seg_kinds=np.zeros(n, dtype=np.uint8),
        output_hash=np.zeros(n, dtype=np.uint64),
        name=f"validate-{point.id}",
        native_block_size=None,
        description=f"replay of {point.id}: {point.lengths}, {point.load}",
    )
    return Trace.from_table(table)


# -- simulation ------------------------------------------------------------------------------------
def engine_config(point: Point, source: dict[str, Any], seed: int = 0) -> EngineConfig:
    """vLLM's defaults, with a source's published batch limits and its engine's KV reservation
    (TensorRT-LLM: ``full``, its default GUARANTEED_NO_EVICT) and chunking (TensorRT-LLM: off by
    default), and a point's multi-step rounds."""
    defaults = EngineConfig()
    return EngineConfig(
        tp=point.tp,
        weight_dtype=point.weight_dtype,
        kv_dtype=point.kv_dtype,
        enable_prefix_caching=False,  # random prompts / radix cache disabled in every source
        max_num_seqs=int(source.get("max_num_seqs", defaults.max_num_seqs)),
        max_num_batched_tokens=int(
            source.get("max_num_batched_tokens", defaults.max_num_batched_tokens)
        ),
        num_scheduler_steps=point.num_scheduler_steps,
        kv_reservation=str(source.get("kv_reservation", "prompt")),
        chunked_prefill=bool(source.get("chunked_prefill", True)),
        seed=seed,
    )


def request_overhead_s(profile: Any) -> float:
    """The profile's per-request overhead, 0 before the cost model has the field."""
    return float(getattr(profile.efficiency, "request_overhead_s", 0.0) or 0.0)


def kvsim_figures(
    requests: Any, simulated_s: float, statistic: str, skip_first_turns: bool = False
) -> dict[str, float]:
    """TTFT/TPOT/E2E (median or mean over completed requests) and output throughput.

    ``skip_first_turns`` leaves the first request of every session out of the latency figures:
    a closed loop starts all its requests at once, and that synchronized first wave queues
    behind itself in a way the steady state the sources describe does not. Throughput counts
    every request over the whole run.
    """
    status = requests.column("status").to_numpy(zero_copy_only=False)
    completed = status == "completed"
    done = completed
    if skip_first_turns:
        steady = completed & (requests.column("turn").to_numpy() > 0)
        done = steady if steady.any() else completed
    stat = np.nanmedian if statistic == "median" else np.nanmean
    out: dict[str, float] = {}
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        values = requests.column(name).to_numpy()[done]
        out[name] = float(stat(values)) if values.size else math.nan
    # kvsim records no per-token times: a request's ITL is its mean gap, i.e. its TPOT.
    out["itl_s"] = out["tpot_s"]
    tokens = float(requests.column("output_tokens").to_numpy()[completed].sum())
    out["output_throughput_tokens_per_s"] = tokens / simulated_s if simulated_s > 0 else math.nan
    return out


def run_point(data: Dataset, point: Point, max_requests: int, seed: int = 0) -> Result:
    """Simulate one point through kvsim's public API."""
    start = time.perf_counter()
    profile = load_profile(point.gpu)
    n = request_count(point, max_requests)
    trace = build_trace(point, n, data.sharegpt, seed)
    config = engine_config(point, data.sources[point.source], seed)
    result = simulate(trace, load_model(point.model), profile, config)
    figures = kvsim_figures(
        result.requests, result.simulated_s, point.statistic, point.arrival == "concurrency"
    )
    overhead = request_overhead_s(profile)
    raw = {m: v - overhead if m in OVERHEAD_METRICS else v for m, v in figures.items()}
    return Result(point, figures, raw, n, time.perf_counter() - start)


# -- fit and errors --------------------------------------------------------------------------------
def signed_error(kvsim: float, measured: float) -> float:
    """(kvsim - measured) / measured."""
    return (kvsim - measured) / measured


def fit_overhead(results: Iterable[Result]) -> tuple[float, int]:
    """Median over fit-half points below saturation of measured TTFT - kvsim TTFT without it."""
    gaps = [
        r.point.measured["ttft_s"] - r.raw["ttft_s"]
        for r in results
        if r.half == "fit" and r.point.below_saturation and "ttft_s" in r.point.measured
    ]
    return (statistics.median(gaps), len(gaps)) if gaps else (0.0, 0)


def apply_fit(results: Iterable[Result], overhead_s: float) -> None:
    for r in results:
        r.fitted = {m: v + overhead_s if m in OVERHEAD_METRICS else v for m, v in r.raw.items()}


def errors(r: Result, which: str) -> dict[str, float]:
    """Signed error per published metric, for kvsim as simulated ("now") or "fitted"."""
    values = r.kvsim if which == "now" else r.fitted
    return {m: signed_error(values[m], v) for m, v in r.point.measured.items()}


def summarize(results: Sequence[Result], which: str) -> list[dict[str, Any]]:
    """Per half, saturation class and metric: count, median |error|, worst |error| (and where)."""
    rows = []
    for half in ("fit", "held-out"):
        for below in (True, False):
            for metric, label in METRICS:
                errs = [
                    (abs(errors(r, which)[metric]), r.point.id)
                    for r in results
                    if r.half == half
                    and r.point.below_saturation == below
                    and metric in r.point.measured
                ]
                if not errs:
                    continue
                worst = max(errs)
                rows.append(
                    {
                        "half": half,
                        "load": "below saturation" if below else "saturated",
                        "metric": label,
                        "n": len(errs),
                        "median": statistics.median(e for e, _ in errs),
                        "worst": worst[0],
                        "worst_id": worst[1],
                    }
                )
    return rows


# -- report ----------------------------------------------------------------------------------------
def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.0%}"


def shown(metric: str, value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if metric.endswith("_s") and not metric.endswith("_per_s"):
        return f"{value * 1e3:.1f} ms" if value < 10 else f"{value:.1f} s"
    return f"{value:,.0f}"


def points_table(results: Sequence[Result]) -> str:
    head = (
        "| point | half | engine | GPU × TP | model | lengths | load | metric | measured | "
        "kvsim now | error now | error fitted |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in sorted(results, key=lambda r: (r.point.source, r.point.id)):
        p = r.point
        now, fitted = errors(r, "now"), errors(r, "fitted")
        for metric, label in METRICS:
            if metric not in p.measured:
                continue
            sat = "" if p.below_saturation else " (sat.)"
            stat = "total" if metric == "output_throughput_tokens_per_s" else p.statistic
            lines.append(
                f"| {p.id} | {r.half} | {p.engine} | {p.gpu} × {p.tp} | {p.model} | "
                f"{p.lengths} | {p.load}{sat} | {label} ({stat}) | "
                f"{shown(metric, p.measured[metric])} | {shown(metric, r.kvsim[metric])} | "
                f"{pct(now[metric])} | {pct(fitted[metric])} |"
            )
    return "\n".join(lines)


def summary_table(results: Sequence[Result]) -> str:
    now = summarize(results, "now")
    fitted = {(s["half"], s["load"], s["metric"]): s for s in summarize(results, "fitted")}
    lines = [
        "| half | load | metric | n | median abs err now | worst now | median abs err fitted "
        "| worst fitted | worst point (fitted) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in now:
        f = fitted[(s["half"], s["load"], s["metric"])]
        lines.append(
            f"| {s['half']} | {s['load']} | {s['metric']} | {s['n']} | {s['median']:.0%} | "
            f"{s['worst']:.0%} | {f['median']:.0%} | {f['worst']:.0%} | {f['worst_id']} |"
        )
    return "\n".join(lines)


def provenance() -> str:
    """The kvsim the figures came from: version, commit, and whether the cost model was edited."""
    root = HERE.parent

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "kvsim", "hardware_profiles")
    state = " plus uncommitted changes to kvsim/ or hardware_profiles/" if dirty else ""
    return f"kvsim {kvsim.__version__} at {head}{state}"


def report(results: Sequence[Result], overhead_s: float, n_fit: int, profile_s: float) -> str:
    held = [
        s
        for s in summarize(results, "fitted")
        if s["half"] == "held-out" and s["load"] == "below saturation"
    ]
    met = all(s["median"] <= MEDIAN_GOAL and s["worst"] <= WORST_GOAL for s in held)
    return "\n".join(
        [
            f"Generated by `python benchmarks/validate_serving.py` from {provenance()}.",
            "",
            f"Fitted per-request overhead: {overhead_s * 1e3:.1f} ms (median over {n_fit} "
            f"fit-half points below saturation; the profiles now carry {profile_s * 1e3:.1f} ms).",
            f"Goal (held-out, below saturation: median |error| <= {MEDIAN_GOAL:.0%}, worst <= "
            f"{WORST_GOAL:.0%} per metric): {'met' if met else 'not met'}.",
            "",
            summary_table(results),
            "",
            points_table(results),
        ]
    )


def update_doc(text: str, path: Path = DOC) -> None:
    """Replace the generated block of the served-runs section, re-reading the file just before."""
    doc = path.read_text(encoding="utf-8")
    start, end = doc.find(DOC_BEGIN), doc.find(DOC_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: markers {DOC_BEGIN!r} ... {DOC_END!r} not found")
    new = doc[: start + len(DOC_BEGIN)] + "\n\n" + text + "\n\n" + doc[end:]
    path.write_text(new, encoding="utf-8")


def write_csv(results: Sequence[Result], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "half", "source", "engine", "gpu", "tp", "model", "lengths", "load",
                    "below_saturation", "statistic", "metric", "measured", "kvsim_now",
                    "kvsim_fitted", "error_now", "error_fitted", "requests", "wall_s"])  # fmt: skip
        for r in results:
            p = r.point
            now, fitted = errors(r, "now"), errors(r, "fitted")
            for metric, value in p.measured.items():
                w.writerow([p.id, r.half, p.source, p.engine, p.gpu, p.tp, p.model, p.lengths,
                            p.load, p.below_saturation, p.statistic, metric, value,
                            r.kvsim[metric], r.fitted[metric], now[metric], fitted[metric],
                            r.requests, round(r.wall_s, 2)])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="points file (TOML)")
    parser.add_argument("--fit", action="store_true", help="print the profile line to paste")
    parser.add_argument("--out", type=Path, help="write points.csv and report.md here")
    parser.add_argument("--max-requests", type=int, default=5000, help="cap per point")
    parser.add_argument("--only", default="", help="run only points whose id contains this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--update-doc", action="store_true", help="rewrite docs/validation.md's block"
    )
    args = parser.parse_args(argv)

    data = load_dataset(args.data)
    halves = split_halves(data.points)
    results = []
    for point in data.points:
        if args.only and args.only not in point.id:
            continue
        r = run_point(data, point, args.max_requests, args.seed)
        r.half = halves[point.id]
        results.append(r)
        print(f"  {point.id}: {r.requests} requests, {r.wall_s:.1f} s", file=sys.stderr)
    overhead, n_fit = fit_overhead(results)
    apply_fit(results, overhead)
    profile_s = max(request_overhead_s(load_profile(g)) for g in {p.gpu for p in data.points})
    text = report(results, overhead, n_fit, profile_s)
    print(text)
    if args.fit:
        print(f"\n[efficiency]\nrequest_overhead_s = {overhead:.4f}  # {n_fit} fit-half points, "
              f"benchmarks/validate_serving.py")  # fmt: skip
        engines = sorted({r.point.engine for r in results})
        for engine in engines:
            gaps = [
                r.point.measured["ttft_s"] - r.raw["ttft_s"]
                for r in results
                if r.point.engine == engine and r.point.below_saturation
                and "ttft_s" in r.point.measured
            ]  # fmt: skip
            if gaps:
                print(f"#   {engine}: median gap {statistics.median(gaps) * 1e3:.1f} ms over "
                      f"{len(gaps)} points (both halves; information only)")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(results, args.out / "points.csv")
        (args.out / "report.md").write_text(text + "\n", encoding="utf-8")
    if args.update_doc:
        update_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

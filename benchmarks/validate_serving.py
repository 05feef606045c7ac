"""Replay published vLLM / SGLang / TensorRT-LLM serving runs through kvsim and report the error.

Issues 11 and 22 ask how far kvsim's served TTFT, TPOT/ITL, E2E and throughput are from real
engines, old and current. Each point of ``benchmarks/validation_data/serving.toml`` is a published
measurement with its configuration (engine, GPU, model, TP, dtypes, lengths or data set, arrival
rate or concurrency); this script builds the same workload as a canonical trace, runs it through
kvsim's public API (``kvsim.engine.simulate``, so it measures whatever the cost model is today)
under the point's engine profile (``EngineConfig(engine=...)``: the profile's scheduler defaults,
overridden only by what the source states it ran with), and prints the signed error
``(kvsim - measured) / measured`` per point and per metric.

Fit and held-out halves. Points are sorted by id within each source and alternate fit, held-out,
fit, ... The one term fitted here is each engine's per-request serving overhead (API server,
tokenization, scheduling, detokenization; ``request_overhead_s`` of its engine profile): the
median over that engine's fit-half points below saturation of ``measured TTFT - kvsim TTFT
without it``. "Without it" subtracts the overhead the run applied (the engine profile's, or the
hardware profile's before kvsim had engine profiles). The report gives every metric twice: kvsim as
it is now, and kvsim with each engine's fitted overhead in place of its profile's, on the fit half
and the held-out half separately. Only the held-out half says how well the fitted model predicts.

Saturation check: for every published sweep of one setup over at least three loads (Poisson rates
or closed-loop concurrencies) with TTFT, the load where TTFT first exceeds 3x its lightest-load
value (interpolated linearly between the loads that bracket it), published against kvsim's on the
published loads plus a grid; the goal is within 15 %.

    python benchmarks/validate_serving.py                  # table on stdout (~7 min on 2 cores)
    python benchmarks/validate_serving.py --fit            # also the engine-profile lines to paste
    python benchmarks/validate_serving.py --engine-filter vllm@0.24,sglang   # a subset, quickly
    python benchmarks/validate_serving.py --out runs/val   # plus points.csv and report.md
    python benchmarks/validate_serving.py --update-doc     # rewrite the generated block of
                                                           # docs/validation.md's served section
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
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
from kvsim.engines import load_engine
from kvsim.hardware import load_profile
from kvsim.models import load_model
from kvsim.traces.schema import Trace, make_trace_table

HERE = Path(__file__).resolve().parent
DATA = HERE / "validation_data" / "serving.toml"
DOC = HERE.parent / "docs" / "validation.md"
DOC_BEGIN = "<!-- validate_serving.py: generated below, do not edit by hand -->"
DOC_END = "<!-- validate_serving.py: generated above -->"

#: Whether EngineConfig takes an engine profile (kvsim with engine profiles) or not (before them:
#: the script then applies the profile's scheduler defaults itself and the hardware profile's
#: request overhead stands).
ENGINE_AWARE = "engine" in {f.name for f in dataclasses.fields(EngineConfig)}

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
REQUIRED = ("id", "source", "published_engine", "gpu", "model", "tp", "weight_dtype", "kv_dtype")
REQUIRED += ("workload", "arrival", "below_saturation", "quote")
ARRIVALS = ("poisson", "concurrency", "offline")
WORKLOADS = ("fixed", "sharegpt", "uniform")
#: Settings a source may state it ran with; they override the engine profile's defaults.
STATED_SETTINGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunked_prefill",
    "kv_reservation",
    "num_gpu_blocks",
)
#: Goals: issue 11's median |error| (and no point below saturation beyond WORST_GOAL); issue 22's
#: saturation load within SATURATION_GOAL.
MEDIAN_GOAL, WORST_GOAL, SATURATION_GOAL = 0.10, 0.25, 0.15
#: A sweep's knee: the load where TTFT first exceeds this multiple of its lightest-load TTFT.
KNEE_FACTOR = 3.0
#: Published loads a sweep needs before its knee is checked; kvsim's extra grid points per sweep.
SWEEP_MIN_LOADS, SWEEP_GRID_POINTS = 3, 8


@dataclass(frozen=True)
class Point:
    """One published measurement and the configuration needed to replay it."""

    id: str
    source: str
    engine: str  # kvsim engine profile (name@version) that replays it
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
    published_engine: str = ""
    statistic: str = "median"
    input_tokens: int = 0
    output_tokens: int = 0
    input_min_tokens: int = 0
    input_max_tokens: int = 0
    output_min_tokens: int = 0  # uniform workload: outputs uniform in [min, max] when given
    output_max_tokens: int = 0
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
    def load_value(self) -> float:
        """The offered load as a number: request rate or concurrency (0 offline)."""
        return {"poisson": self.rate_per_s, "concurrency": float(self.concurrency)}.get(
            self.arrival, 0.0
        )

    @property
    def lengths(self) -> str:
        if self.workload == "fixed":
            return f"{self.input_tokens}/{self.output_tokens}"
        if self.workload == "uniform":
            out = str(self.output_tokens)
            if self.output_max_tokens:
                out = f"{self.output_min_tokens}-{self.output_max_tokens}"
            return f"{self.input_min_tokens}-{self.input_max_tokens}/{out}"
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
    """kvsim's figures for one point: as simulated, and with the run's overhead removed."""

    point: Point
    kvsim: dict[str, float]
    raw: dict[str, float]  # kvsim minus the request overhead the run applied (TTFT, E2E)
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
        engine = raw.get("engine", sources[raw["source"]].get("engine"))
        if not engine:
            raise ValueError(f"{path.name}: point {where}: no engine (point or source)")
        if raw["arrival"] not in ARRIVALS or raw["workload"] not in WORKLOADS:
            raise ValueError(f"{path.name}: point {where}: unknown arrival or workload")
        measured = {m: float(raw[m]) for m, _ in METRICS if m in raw}
        if not measured:
            raise ValueError(f"{path.name}: point {where}: no published metric")
        needs = {"poisson": "rate_per_s", "concurrency": "concurrency"}.get(raw["arrival"])
        if needs and needs not in raw:
            raise ValueError(f"{path.name}: point {where}: {raw['arrival']} needs {needs}")
        outputs = ("output_min_tokens", "output_max_tokens")
        if not all(k in raw for k in outputs):
            outputs = ("output_tokens",)
        lengths = {
            "fixed": ("input_tokens", "output_tokens"),
            "uniform": ("input_min_tokens", "input_max_tokens", *outputs),
        }.get(raw["workload"], ())
        if not all(raw.get(k) for k in lengths):
            raise ValueError(f"{path.name}: point {where}: {raw['workload']} needs {lengths}")
        fields = {k: raw[k] for k in Point.__dataclass_fields__ if k in raw and k != "measured"}
        fields["engine"] = engine
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


def engine_matches(engine: str, terms: Sequence[str]) -> bool:
    """``--engine-filter``: a term names a profile (``vllm@0.24``) or every version (``vllm``)."""
    return any(engine == t or engine.startswith(f"{t}@") for t in terms)


def sharegpt_for(data: Dataset, point: Point) -> ShareGPT | None:
    """The ShareGPT lengths for a point: the file's, with its source's published means if any."""
    if data.sharegpt is None:
        return None
    source = data.sources.get(point.source, {})
    return dataclasses.replace(
        data.sharegpt,
        input_mean_tokens=float(
            source.get("sharegpt_input_mean_tokens", data.sharegpt.input_mean_tokens)
        ),
        output_mean_tokens=float(
            source.get("sharegpt_output_mean_tokens", data.sharegpt.output_mean_tokens)
        ),
    )


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
    elif point.workload == "uniform":
        inputs = rng.integers(point.input_min_tokens, point.input_max_tokens + 1, n)
        if point.output_max_tokens:
            outputs = rng.integers(point.output_min_tokens, point.output_max_tokens + 1, n)
        else:
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
def stated_settings(point: Point, source: dict[str, Any]) -> dict[str, Any]:
    """What the source states the engine ran with: these, and only these, override its profile."""
    stated: dict[str, Any] = {k: source[k] for k in STATED_SETTINGS if k in source}
    if point.num_scheduler_steps != 1:
        stated["num_scheduler_steps"] = point.num_scheduler_steps
    return stated


def engine_config(point: Point, source: dict[str, Any], seed: int = 0) -> EngineConfig:
    """The point's engine profile with the source's stated settings on top.

    Before kvsim had engine profiles (no ``EngineConfig.engine``), the profile's scheduler
    defaults are applied here instead, so the replay runs the same scheduler either way.
    """
    base: dict[str, Any] = {
        "tp": point.tp,
        "weight_dtype": point.weight_dtype,
        "kv_dtype": point.kv_dtype,
        "enable_prefix_caching": False,  # random prompts / radix cache disabled in every source
        "seed": seed,
    }
    stated = stated_settings(point, source)
    if ENGINE_AWARE:
        return EngineConfig(engine=point.engine, **base, **stated)  # type: ignore[call-arg]
    defaults = dict(load_engine(point.engine).defaults)
    return EngineConfig(**base, **{**defaults, **stated})


def request_overhead_s(profile: Any) -> float:
    """A hardware profile's per-request overhead, 0 before the cost model had the field."""
    return float(getattr(profile.efficiency, "request_overhead_s", 0.0) or 0.0)


def applied_overhead_s(point: Point) -> float:
    """The per-request overhead a replay of ``point`` pays: its engine profile's (through the
    hardware profile's kernel terms for that engine, as the cost model reads it), or the hardware
    profile's before kvsim had engine profiles."""
    profile = load_profile(point.gpu)
    if ENGINE_AWARE:
        from kvsim.costmodel.engine_terms import under_engine

        profile = under_engine(profile, load_engine(point.engine))
    return request_overhead_s(profile)


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
    trace = build_trace(point, n, sharegpt_for(data, point), seed)
    config = engine_config(point, data.sources[point.source], seed)
    result = simulate(trace, load_model(point.model), profile, config)
    figures = kvsim_figures(
        result.requests, result.simulated_s, point.statistic, point.arrival == "concurrency"
    )
    overhead = applied_overhead_s(point)
    raw = {m: v - overhead if m in OVERHEAD_METRICS else v for m, v in figures.items()}
    return Result(point, figures, raw, n, time.perf_counter() - start)


# -- fit and errors --------------------------------------------------------------------------------
def signed_error(kvsim: float, measured: float) -> float:
    """(kvsim - measured) / measured."""
    return (kvsim - measured) / measured


def fit_overheads(
    results: Iterable[Result], extra: dict[str, dict[str, list[float]]] | None = None
) -> dict[str, tuple[float, int, float, int]]:
    """engine -> (fitted overhead, points, median gap, sources). Each source gets one vote:
    the median over its fit-half points below saturation of measured TTFT - kvsim TTFT without
    the overhead (arrivals over time, not all at once); the engine's fit is the median of its
    sources' votes, floored at 0 for the
    fitted value (a negative gap means kvsim's TTFT is too high without any front end, which
    an overhead cannot fix), so a source with many points cannot outvote the others.
    ``extra``: more gaps per engine and source, measured elsewhere (the single-request TTFTs of
    benchmarks/validate_tiers.py). Engines with no such point are absent."""
    gaps: dict[str, dict[str, list[float]]] = {}
    for r in results:
        # all requests at once ("offline") measure each one's wait behind the others' prefill,
        # not the front end
        light = r.point.below_saturation and r.point.arrival != "offline"
        if r.half == "fit" and light and "ttft_s" in r.point.measured:
            by_source = gaps.setdefault(r.point.engine, {})
            by_source.setdefault(r.point.source, []).append(
                r.point.measured["ttft_s"] - r.raw["ttft_s"]
            )
    for engine, sources in (extra or {}).items():
        if engine in gaps or any(r.point.engine == engine for r in results):
            for source, g in sources.items():
                gaps.setdefault(engine, {}).setdefault(source, []).extend(g)
    fits = {}
    for engine, sources in sorted(gaps.items()):
        gap = statistics.median(statistics.median(g) for g in sources.values())
        points = sum(len(g) for g in sources.values())
        fits[engine] = (max(gap, 0.0), points, gap, len(sources))
    return fits


def tier_gaps() -> dict[str, dict[str, list[float]]]:
    """The front-end gaps of the single-request TTFTs benchmarks/validate_tiers.py compares
    (vLLM's offloading post, Figure 1: the load-from-CPU runs at its fit-half lengths), for the
    engine those runs are replayed under."""
    if str(HERE) not in sys.path:  # loaded by file (the tests), not run from benchmarks/
        sys.path.insert(0, str(HERE))
    from validate_tiers import ENGINE, SOURCE_ID, front_end_gaps

    return {ENGINE: {SOURCE_ID: front_end_gaps("fit")}}


def apply_fit(results: Iterable[Result], overheads: dict[str, float]) -> None:
    """Each result's figures with its engine's fitted overhead (the applied one where none)."""
    for r in results:
        extra = overheads.get(r.point.engine, r.kvsim["ttft_s"] - r.raw["ttft_s"])
        r.fitted = {m: v + extra if m in OVERHEAD_METRICS else v for m, v in r.raw.items()}


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


#: The engine x GPU tables' columns: (label, metrics read in order, below saturation only).
#: TPOT/ITL takes a point's TPOT, else its ITL (kvsim's ITL is its TPOT); TTFT is compared below
#: saturation only, since a saturated TTFT measures the queue, which the saturation check covers.
CELL_METRICS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("TTFT", ("ttft_s",), True),
    ("TPOT/ITL", ("tpot_s", "itl_s"), False),
    ("E2E", ("e2e_s",), False),
    ("throughput", ("output_throughput_tokens_per_s",), False),
)


def cell_errors(
    results: Iterable[Result], which: str, metrics: Sequence[str], below_only: bool
) -> list[float]:
    """|error| of the first of ``metrics`` each result publishes."""
    out = []
    for r in results:
        if below_only and not r.point.below_saturation:
            continue
        metric = next((m for m in metrics if m in r.point.measured), None)
        if metric is not None:
            out.append(abs(errors(r, which)[metric]))
    return out


def engine_gpu_groups(results: Sequence[Result]) -> dict[tuple[str, str], list[Result]]:
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.point.engine, r.point.gpu), []).append(r)
    return dict(sorted(groups.items()))


# -- saturation ------------------------------------------------------------------------------------
@dataclass
class Sweep:
    """One setup published at several loads: its knee, published and in kvsim."""

    key: str
    points: list[Point]
    published_knee: float | None
    published_bracket: tuple[float, float] | None
    kvsim_loads: list[float] = field(default_factory=list)
    kvsim_ttft: list[float] = field(default_factory=list)
    kvsim_knee: float | None = None

    @property
    def max_load(self) -> float:
        return max(p.load_value for p in self.points)

    @property
    def unit(self) -> str:
        return "req/s" if self.points[0].arrival == "poisson" else "concurrent"

    def verdict(self) -> tuple[str, bool | None]:
        """(what the comparison says, whether it meets the goal; None: cannot be judged)."""
        pub, sim = self.published_knee, self.kvsim_knee
        if pub is not None and sim is not None:
            err = sim / pub - 1
            return f"{err:+.0%}", abs(err) <= SATURATION_GOAL
        if pub is None and (sim is None or sim > self.max_load):
            return f"both above {self.max_load:g} (published bound)", True
        if pub is None:
            return f"kvsim saturates below the published {self.max_load:g}", False
        return "kvsim does not saturate on its grid", False


def knee(loads: Sequence[float], ttft: Sequence[float]) -> tuple[float | None, tuple | None]:
    """The load where TTFT first exceeds KNEE_FACTOR x its lightest-load value, interpolated
    linearly between the two loads around it; (None, None) if it never does."""
    order = sorted(range(len(loads)), key=lambda i: loads[i])
    xs = [loads[i] for i in order]
    ys = [ttft[i] for i in order]
    limit = KNEE_FACTOR * ys[0]
    for i in range(1, len(xs)):
        if ys[i] > limit:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return x0 + (x1 - x0) * (limit - y0) / (y1 - y0), (x0, x1)
    return None, None


def find_sweeps(points: Sequence[Point]) -> list[Sweep]:
    """Published sweeps: one source, engine, GPU, model, TP, lengths and arrival kind at
    SWEEP_MIN_LOADS or more loads, each with a TTFT."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        if p.arrival == "offline" or "ttft_s" not in p.measured:
            continue
        key = f"{p.source}: {p.engine} {p.model} {p.gpu}x{p.tp} {p.lengths} ({p.arrival})"
        groups.setdefault(key, []).append(p)
    sweeps = []
    for key, group in sorted(groups.items()):
        if len({p.load_value for p in group}) < SWEEP_MIN_LOADS:
            continue
        pub, bracket = knee([p.load_value for p in group], [p.measured["ttft_s"] for p in group])
        sweeps.append(Sweep(key, sorted(group, key=lambda p: p.load_value), pub, bracket))
    return sweeps


def with_load(point: Point, load: float) -> Point:
    """``point`` at another offered load (rate or concurrency)."""
    if point.arrival == "poisson":
        return dataclasses.replace(point, id=f"{point.id}@{load:g}", rate_per_s=load)
    return dataclasses.replace(
        point, id=f"{point.id}@{load:g}", concurrency=int(load), num_prompts=None
    )


def grid_loads(sweep: Sweep) -> list[float]:
    """Loads kvsim runs beyond the published ones: geometric from the lightest load to the
    heaviest (x4 when the published runs never saturate, to find kvsim's own knee)."""
    low = min(p.load_value for p in sweep.points)
    high = sweep.max_load * (1 if sweep.published_knee is not None else 4)
    grid = np.geomspace(low, high, SWEEP_GRID_POINTS + 2)[1:]
    if sweep.points[0].arrival == "concurrency":
        grid = np.unique(np.rint(grid))
    else:
        grid = np.unique(np.round(grid, 2))
    published = {p.load_value for p in sweep.points}
    return [float(x) for x in grid if float(x) not in published]


def check_saturation(
    data: Dataset, sweeps: Sequence[Sweep], results: Sequence[Result], max_requests: int, seed: int
) -> None:
    """kvsim's TTFT at each sweep's published loads (already run) and on its grid, and its knee
    (looked for up to 4x the heaviest published load when the grid does not reach it)."""
    by_id = {r.point.id: r for r in results}
    for sweep in sweeps:
        template = sweep.points[-1]
        loads, ttft = [], []
        for p in sweep.points:
            r = by_id.get(p.id) or run_point(data, p, max_requests, seed)
            loads.append(p.load_value)
            ttft.append(r.kvsim["ttft_s"])
        for load in grid_loads(sweep):
            r = run_point(data, with_load(template, load), max_requests, seed)
            print(f"  saturation grid {template.id} at {load:g}: {r.wall_s:.1f} s", file=sys.stderr)
            loads.append(load)
            ttft.append(r.kvsim["ttft_s"])
        sweep.kvsim_knee, _ = knee(loads, ttft)
        if sweep.kvsim_knee is None:  # not within the published range: look beyond it, to 4x
            for load in np.geomspace(sweep.max_load, 4 * sweep.max_load, 4)[1:]:
                load = float(np.rint(load)) if template.arrival == "concurrency" else float(load)
                r = run_point(data, with_load(template, load), max_requests, seed)
                loads.append(load)
                ttft.append(r.kvsim["ttft_s"])
            sweep.kvsim_knee, _ = knee(loads, ttft)
        order = sorted(range(len(loads)), key=lambda i: loads[i])
        sweep.kvsim_loads = [loads[i] for i in order]
        sweep.kvsim_ttft = [ttft[i] for i in order]


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
        "| point | half | engine (published) | GPU × TP | model | lengths | load | metric | "
        "measured | kvsim now | error now | error fitted |\n"
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
                f"| {p.id} | {r.half} | {p.engine} ({p.published_engine}) | {p.gpu} × {p.tp} | "
                f"{p.model} | {p.lengths} | {p.load}{sat} | {label} ({stat}) | "
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


def median_cell(errs: Sequence[float]) -> str:
    """'12% (n=3)' with a mark when the median misses MEDIAN_GOAL; '–' when nothing to compare."""
    if not errs:
        return "–"
    med = statistics.median(errs)
    mark = "" if med <= MEDIAN_GOAL else " ✗"
    return f"{med:.0%}{mark} (n={len(errs)})"


def engine_gpu_tables(results: Sequence[Result]) -> str:
    """One table per engine x GPU: held-out median |error| (fitted), and over every point."""
    blocks = []
    for (engine, gpu), group in engine_gpu_groups(results).items():
        held = [r for r in group if r.half == "held-out"]
        published = sorted({r.point.published_engine for r in group})
        models = sorted({f"{r.point.model} TP{r.point.tp}" for r in group})
        lines = [
            f"**{engine} on {gpu}** ({len(group)} points, {len(held)} held out; published: "
            f"{'; '.join(published)}; {', '.join(models)})",
            "",
            "| metric | held-out, fitted | held-out, now | all points, fitted |",
            "|---|---|---|---|",
        ]
        for label, metrics, below_only in CELL_METRICS:
            cells = [
                median_cell(cell_errors(held, "fitted", metrics, below_only)),
                median_cell(cell_errors(held, "now", metrics, below_only)),
                median_cell(cell_errors(group, "fitted", metrics, below_only)),
            ]
            lines.append(f"| {label} | {' | '.join(cells)} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def overhead_table(
    results: Sequence[Result], fits: dict[str, tuple[float, int, float, int]]
) -> str:
    """Each engine's profile overhead and the value fitted on its fit half."""
    lines = [
        "| engine | profile's request_overhead_s | fitted | fit-half points (sources) | line for "
        "kvsim/engines/profiles/ENGINE.toml |",
        "|---|---|---|---|---|",
    ]
    for engine in sorted({r.point.engine for r in results}):
        applied = next(
            r.kvsim["ttft_s"] - r.raw["ttft_s"] for r in results if r.point.engine == engine
        )
        if engine in fits:
            value, n, gap, sources = fits[engine]
            line = f"`request_overhead_s = {value:.4f}`"
            shown_gap = "" if gap >= 0 else f" (median gap {gap * 1e3:+.1f} ms)"
            lines.append(
                f"| {engine} | {applied * 1e3:.1f} ms | {value * 1e3:.1f} ms{shown_gap} | {n} "
                f"({sources}) | {line} |"
            )
        else:
            lines.append(f"| {engine} | {applied * 1e3:.1f} ms | – | 0 | (kept) |")
    return "\n".join(lines)


def saturation_table(sweeps: Sequence[Sweep]) -> str:
    lines = [
        f"| sweep | published loads | published knee (TTFT > {KNEE_FACTOR:g}× lightest) | "
        "kvsim knee | error | within the published bracket | goal ±15 % |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sweeps:
        loads = ", ".join(f"{p.load_value:g}" for p in s.points)
        if s.published_knee is not None and s.published_bracket is not None:
            lo, hi = s.published_bracket
            pub = f"{s.published_knee:.3g} {s.unit} (between {lo:g} and {hi:g})"
        else:
            pub = f"> {s.max_load:g} {s.unit} (never within the sweep)"
        grid_top = max(s.kvsim_loads) if s.kvsim_loads else s.max_load
        sim = f"{s.kvsim_knee:.3g} {s.unit}" if s.kvsim_knee is not None else f"> {grid_top:g}"
        text, ok = s.verdict()
        inside = "–"
        if s.published_bracket is not None and s.kvsim_knee is not None:
            lo, hi = s.published_bracket
            inside = "yes" if lo <= s.kvsim_knee <= hi else "no"
        lines.append(
            f"| {s.key} | {loads} | {pub} | {sim} | {text} | {inside} | "
            f"{'met' if ok else 'missed' if ok is False else 'n/a'} |"
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
    mode = "engine profiles" if ENGINE_AWARE else "no engine profiles yet (defaults applied here)"
    return f"kvsim {kvsim.__version__} at {head}{state}; {mode}"


def report(
    results: Sequence[Result], fits: dict[str, tuple[float, int, float]], sweeps: Sequence[Sweep]
) -> str:
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
            "Per-request overhead by engine (fitted: median over the engine's fit-half points "
            "below saturation of measured TTFT − kvsim TTFT without it):",
            "",
            overhead_table(results, fits),
            "",
            f"Median |error| per engine × GPU, held-out half with each engine's fitted overhead "
            f"(goal ≤ {MEDIAN_GOAL:.0%}; ✗ marks a miss). TTFT over points below saturation, the "
            "other metrics over every load; TPOT/ITL is a point's TPOT, else its ITL.",
            "",
            engine_gpu_tables(results),
            "",
            f"Saturation check (goal: kvsim's knee within {SATURATION_GOAL:.0%} of the "
            "published one):",
            "",
            saturation_table(sweeps) if sweeps else "(no sweep in the points run)",
            "",
            f"All engines together (held-out, below saturation: median |error| <= "
            f"{MEDIAN_GOAL:.0%}, worst <= {WORST_GOAL:.0%} per metric): "
            f"{'met' if met else 'not met'}.",
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
        w.writerow(["id", "half", "source", "engine", "published_engine", "gpu", "tp", "model",
                    "lengths", "load", "below_saturation", "statistic", "metric", "measured",
                    "kvsim_now", "kvsim_fitted", "error_now", "error_fitted", "requests",
                    "wall_s"])  # fmt: skip
        for r in results:
            p = r.point
            now, fitted = errors(r, "now"), errors(r, "fitted")
            for metric, value in p.measured.items():
                w.writerow([p.id, r.half, p.source, p.engine, p.published_engine, p.gpu, p.tp,
                            p.model, p.lengths, p.load, p.below_saturation, p.statistic, metric,
                            value, r.kvsim[metric], r.fitted[metric], now[metric],
                            fitted[metric], r.requests, round(r.wall_s, 2)])  # fmt: skip


def fit_lines(fits: dict[str, tuple[float, int, float, int]]) -> str:
    """The line to paste into each fitted engine's profile, with its provenance."""
    out = []
    for engine, (value, n, gap, sources) in fits.items():
        out.append(
            f"# kvsim/engines/profiles/{engine}.toml\nrequest_overhead_s = {value:.4f}"
            f'\n# [sources] request_overhead_s = "measured: benchmarks/validate_serving.py --fit, '
            f"median over {sources} sources of each one's median, over {n} fit-half published "
            f"runs below saturation, of measured TTFT minus kvsim TTFT without it "
            f'({gap * 1e3:+.1f} ms, floored at 0)"'
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="points file (TOML)")
    parser.add_argument("--fit", action="store_true", help="print the engine-profile lines")
    parser.add_argument("--out", type=Path, help="write points.csv and report.md here")
    parser.add_argument("--max-requests", type=int, default=5000, help="cap per point")
    parser.add_argument("--only", default="", help="run only points whose id contains this")
    parser.add_argument(
        "--engine-filter",
        default="",
        help="comma-separated engine profiles to run (vllm@0.24) or names (every version: sglang)",
    )
    parser.add_argument("--no-saturation", action="store_true", help="skip the saturation check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--update-doc", action="store_true", help="rewrite docs/validation.md's block"
    )
    args = parser.parse_args(argv)
    terms = [t.strip() for t in args.engine_filter.split(",") if t.strip()]
    if args.update_doc and (terms or args.only or args.no_saturation):
        parser.error("--update-doc writes the full validation: drop --engine-filter/--only")

    data = load_dataset(args.data)
    halves = split_halves(data.points)
    chosen = [
        p
        for p in data.points
        if (not args.only or args.only in p.id) and (not terms or engine_matches(p.engine, terms))
    ]
    if not chosen:
        parser.error("no point matches --only / --engine-filter")
    results = []
    for point in chosen:
        r = run_point(data, point, args.max_requests, args.seed)
        r.half = halves[point.id]
        results.append(r)
        print(f"  {point.id}: {r.requests} requests, {r.wall_s:.1f} s", file=sys.stderr)
    fits = fit_overheads(results, tier_gaps())
    apply_fit(results, {engine: value for engine, (value, *_) in fits.items()})
    sweeps = [] if args.no_saturation else find_sweeps(chosen)
    check_saturation(data, sweeps, results, args.max_requests, args.seed)
    text = report(results, fits, sweeps)
    print(text)
    if args.fit:
        print("\n" + fit_lines(fits))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(results, args.out / "points.csv")
        (args.out / "report.md").write_text(text + "\n", encoding="utf-8")
    if args.update_doc:
        update_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

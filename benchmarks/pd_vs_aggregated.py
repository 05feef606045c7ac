"""P/D disaggregation against aggregated serving, in kind with DistServe (OSDI'24).

    python benchmarks/pd_vs_aggregated.py                # full sweep, Markdown on stdout
    python benchmarks/pd_vs_aggregated.py --quick        # fewer requests and rates
    python benchmarks/pd_vs_aggregated.py --update-doc   # also rewrite the generated block of
                                                         # docs/disaggregation.md and its PNG

DistServe's artifact (LLMServe/DistServe, evaluation/ae-scripts/e2e/_plot.py and
2-benchmark-serving/2-start-api-server.py) sweeps the per-GPU request rate and plots the share
of requests that meet both a TTFT and a TPOT objective. This script replays its two contrasting
applications through kvsim on the same GPU count for both modes:

- chatbot: OPT-13B, ShareGPT-like prompts (short: mean about 530 tokens), TTFT <= 0.25 s and
  TPOT <= 0.1 s; DistServe's placement is 2 prefill GPUs and 1 decode GPU, vLLM's 1 GPU each.
- summarization: OPT-66B, LongBench-like prompts (about 1,900-2,040 tokens), TTFT <= 15 s and
  TPOT <= 0.15 s; DistServe's placement is 4 prefill and 4 decode GPUs, vLLM's TP 4.

Everything printed is computed by kvsim at run time (the iteration timing is whatever the
installed kvsim prices); only the paper's setup (rates, SLOs, placements, length rules) is
written here, each with its source. Seeds are fixed, so two runs print the same tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from kvsim.engine import EngineConfig, simulate
from kvsim.engine.handoff import Handoff
from kvsim.engine.resolve import resolve_engine
from kvsim.hardware import load_profile
from kvsim.kvcache.block_table import BlockTable
from kvsim.kvcache.request import Request
from kvsim.metrics import Slo, summarize
from kvsim.models import load_model
from kvsim.traces import Trace, load_trace, make_trace_table

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "distserve"
DOC = ROOT / "docs" / "disaggregation.md"
PLOT = ROOT / "docs" / "disaggregation.png"
DOC_BEGIN = "<!-- pd_vs_aggregated.py: generated below, do not edit by hand -->"
DOC_END = "<!-- pd_vs_aggregated.py: generated above -->"
#: The attainment DistServe reads its goodput at (_plot.py: atta_target 90).
TARGET = 0.90
#: assumption: DistServe's testbed is of this kind (A100-80GB SXM, 8 per node, NVLink), as its
#: evaluation section describes; not re-checked against the paper here.
HARDWARE = "a100-80gb"
SEED = 0


@dataclass(frozen=True)
class Mode:
    """One way to serve an application on the same GPUs: aggregated replicas or a P/D split."""

    label: str
    settings: dict[str, object]
    pd: tuple[int, int] | None = None  # (prefill, decode) replicas; None: aggregated


@dataclass(frozen=True)
class App:
    """One of DistServe's applications, as its artifact runs it."""

    name: str
    model: str  # a model file under benchmarks/data/distserve
    tp: int
    gpus: int  # GPUs each mode gets
    ttft_s: float
    tpot_s: float
    rates: tuple[float, ...]  # per-GPU request rates (req/s/GPU)
    scale_rate: float  # the per-GPU rate of the SLO-scale plot
    lengths: str  # "sharegpt" or "longbench"
    modes: tuple[Mode, ...] = field(default=())
    # tighter TPOT bounds (TTFT kept) whose attainment is recomputed from the same runs
    tpot_bounds_s: tuple[float, ...] = ()
    plot_tpot_s: float | None = None  # the tighter bound the plot's second row shows


# vLLM as DistServe ran it (2-start-api-server.py): block 16, max-num-batched-tokens 16384,
# max-num-seqs 1024. Whole prompts in prefill-only iterations, prefill first: the vLLM fork it
# compared with (README: branch distserve-baseline-vllm, 2023) predates chunked prefill and
# scheduled waiting prompts before running decodes (assumption: vLLM's scheduler of 2023).
DISTSERVE_VLLM: dict[str, object] = dict(
    chunked_prefill=False, mixed_batches=False, max_num_batched_tokens=16384, max_num_seqs=1024
)
# P/D instances as DistServe ran them (2-start-api-server.py): whole prompts, context batches of
# at most 8192 tokens, decode batches of at most 1024 sequences.
DISTSERVE_PD: dict[str, object] = dict(
    chunked_prefill=False, max_num_batched_tokens=8192, max_num_seqs=1024
)
# kvsim's own defaults (its default engine profile's scheduler settings), and chunked prefill
# with a small budget (Sarathi-Serve's remedy for prefill-decode interference).
CURRENT: dict[str, object] = {}
SMALL_CHUNK: dict[str, object] = dict(max_num_batched_tokens=512)


def _modes(pd_splits: Sequence[tuple[int, int]]) -> tuple[Mode, ...]:
    aggregated = (
        Mode("aggregated, DistServe's vLLM (prefill-only iterations)", DISTSERVE_VLLM),
        Mode("aggregated, kvsim default settings", CURRENT),
        Mode("aggregated, chunked 512", SMALL_CHUNK),
    )
    split = tuple(Mode(f"P/D {p}:{d}", DISTSERVE_PD, (p, d)) for p, d in pd_splits)
    return aggregated + split


APPS: tuple[App, ...] = (
    # _plot.py plot_fig8_upper, "opt-13b-sharegpt": per-GPU rates, TTFT 0.25 s, TPOT 0.1 s;
    # DistServe on 3 GPUs (2-start-api-server.py: context TP 2, decoding TP 1), vLLM on 1.
    App(
        name="chatbot",
        model="opt-13b",
        tp=1,
        gpus=3,
        ttft_s=0.25,
        tpot_s=0.1,
        # the artifact's rates, then two past them (assumption: to find where kvsim's
        # aggregated serving falls through 90 %)
        rates=(0.25, 0.5, 1.0, 1.5, 2.0, 2.25, 2.5, 3.0, 4.0, 5.0),
        scale_rate=1.5,  # _plot.py plot_fig8_lower: (100, 1.5)
        lengths="sharegpt",
        modes=_modes([(2, 1), (1, 2)]),
        tpot_bounds_s=(0.05, 0.04, 0.03, 0.025),
        plot_tpot_s=0.04,
    ),
    # _plot.py plot_fig9, "opt-66b-longbench": per-GPU rates, TTFT 15 s, TPOT 0.15 s;
    # DistServe on 8 GPUs (context TP 4, decoding TP 2 x PP 2), vLLM on 4 (TP 4).
    App(
        name="summarization",
        model="opt-66b",
        tp=4,
        gpus=8,
        ttft_s=15.0,
        tpot_s=0.15,
        # the artifact's rates (to 0.625), then three past them (assumption, as for the chatbot)
        rates=(
            *(0.0625, 0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.5625, 0.625),
            *(0.75, 0.875, 1.0),
        ),
        scale_rate=0.375,  # _plot.py plot_fig9: (25, 0.375)
        lengths="longbench",
        modes=_modes([(1, 1)]),
        tpot_bounds_s=(0.1, 0.08, 0.07, 0.06, 0.05, 0.04),
        plot_tpot_s=0.05,
    ),
    # The same on two nodes, where TP 4 allows other splits than 1:1 (assumption: ours, not
    # the paper's; a split's pulls between nodes go over the profile's fabric). Fewer rates,
    # around the knee, to keep the run short.
    App(
        name="summarization, 16 GPUs",
        model="opt-66b",
        tp=4,
        gpus=16,
        ttft_s=15.0,
        tpot_s=0.15,
        rates=(0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.5625, 0.625, 0.75),
        scale_rate=0.375,
        lengths="longbench",
        modes=_modes([(3, 1), (2, 2)]),
        tpot_bounds_s=(0.1, 0.08, 0.07, 0.06, 0.05, 0.04),
        plot_tpot_s=0.05,
    ),
)
#: SLO scales of the second sweep (_plot.py multiplies both objectives by the scale).
SCALES = (0.4, 0.6, 0.8, 1.0, 1.2, 1.6, 2.0, 4.0)


# -- workloads -----------------------------------------------------------------------------------
def lengths(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of `n` requests, drawn with `seed`.

    - sharegpt: requests of kvsim's built-in `sharegpt` trace (real ShareGPT first-turn prompt
      lengths, drawn later turns and replies) whose prompt + output < 2048 tokens, the filter
      DistServe's 0-prepare-dataset.py applies for OPT's 2048 positions; drawn with replacement.
    - longbench: DistServe's rule (0-prepare-dataset.py):
      prompt = min(2040 - output, U{1900..2048}).
      The outputs are LongBench's reference answers, which we do not have here; assumption: a
      lognormal with median 64 tokens and sigma 1, kept to [2, 512] (short QA answers to
      summaries of a few hundred tokens).
    """
    rng = np.random.default_rng(seed)
    if kind == "sharegpt":
        table = load_trace("sharegpt").table
        prompt = table.column("input_tokens").to_numpy().astype(np.int64)
        output = table.column("output_tokens").to_numpy().astype(np.int64)
        keep = np.flatnonzero(prompt + output < 2048)
        pick = rng.choice(keep, size=n, replace=True)
        return prompt[pick], output[pick]
    if kind == "longbench":
        output = np.clip(np.round(rng.lognormal(math.log(64), 1.0, n)), 2, 512).astype(np.int64)
        prompt = np.minimum(2040 - output, rng.integers(1900, 2049, n)).astype(np.int64)
        return prompt, output
    raise ValueError(f"unknown length distribution {kind!r}")


def poisson_trace(
    prompt: np.ndarray, output: np.ndarray, rate_per_s: float, seed: int, name: str
) -> Trace:
    """One request per row, Poisson arrivals at `rate_per_s` (DistServe's client draws gamma
    intervals with cv 1), every prompt its own content (no prefix reuse)."""
    n = len(prompt)
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    ids = np.arange(n, dtype=np.int64)
    table = make_trace_table(
        request_id=ids,
        session_id=ids,
        turn=np.zeros(n, np.int32),
        arrival_s=arrival,
        think_time_s=None,
        input_tokens=prompt,
        output_tokens=output,
        seg_offsets=np.arange(n + 1, dtype=np.int64),
        seg_hashes=(ids + 1).astype(np.uint64),
        seg_tokens=prompt,
        seg_kinds=np.zeros(n, np.uint8),
        output_hash=np.zeros(n, np.uint64),
        name=name,
        native_block_size=None,
        description=f"{name}: {n} requests, Poisson arrivals at {rate_per_s:g}/s, seed {seed}",
    )
    return Trace.from_table(table)


# -- attainment ----------------------------------------------------------------------------------
def attainment(requests: pa.Table, ttft_s: float | None, tpot_s: float | None) -> float:
    """Share of all requests (unfinished ones miss) whose TTFT and mean TPOT meet the bounds.

    DistServe's get_attainment (_plot.py) counts a request when ftl <= TTFT and tpot <= TPOT;
    its TPOT, like kvsim's `tpot_s`, is a request's decode time over its output tokens less
    one. A one-token reply has no TPOT and meets any bound."""
    status = requests.column("status").to_numpy(zero_copy_only=False)
    return met(
        status == "completed",
        requests.column("ttft_s").to_numpy(),
        requests.column("tpot_s").to_numpy(),
        ttft_s,
        tpot_s,
    )


def met(
    done: np.ndarray,
    ttft: np.ndarray,
    tpot: np.ndarray,
    ttft_s: float | None,
    tpot_s: float | None,
) -> float:
    """`attainment` on arrays: the share of rows done and within both bounds."""
    meets = done.copy()
    if ttft_s is not None:
        meets &= ttft <= ttft_s
    if tpot_s is not None:
        meets &= np.isnan(tpot) | (tpot <= tpot_s)
    return float(meets.mean()) if len(meets) else 0.0


class PrefillEnds:
    """When each P/D request's prompt was computed, read off `Handoff.prefilled`.

    DistServe's prefill instance returns the first token (single_stage_engine.py: the context
    stage's step output goes to the user at ContextEnd, before migration), so its TTFT ends
    when the prefill does and the KV transfer and decode queueing fall into TPOT. kvsim's
    first token comes from the decode replica's first step (as vLLM's and llm-d's connectors
    serve it). kvsim records no prefill end, so this wraps the hand-off for one run: a
    measurement hook in the benchmark, no change to the engine."""

    def __init__(self) -> None:
        self.ends: dict[int, float] = {}
        self._original = Handoff.prefilled

    def __enter__(self) -> PrefillEnds:
        ends, original = self.ends, self._original

        def prefilled(handoff: Handoff, req: Request, table: BlockTable) -> None:
            ends[req.index] = handoff.env.now
            original(handoff, req, table)

        Handoff.prefilled = prefilled  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Handoff.prefilled = self._original  # type: ignore[method-assign]

    def distserve_view(self, requests: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """(TTFT, TPOT) per request as DistServe counts them; kvsim's own for requests that
        were not handed off (aggregated runs)."""
        n = requests.num_rows
        end = np.array([self.ends.get(i, np.nan) for i in range(n)])
        arrival = requests.column("arrival_s").to_numpy()
        finish = requests.column("finish_s").to_numpy()
        output = requests.column("output_tokens").to_numpy()
        ttft = requests.column("ttft_s").to_numpy().copy()
        tpot = requests.column("tpot_s").to_numpy().copy()
        handed = ~np.isnan(end)
        ttft[handed] = end[handed] - arrival[handed]
        many = handed & (output > 1)
        tpot[many] = (finish[many] - end[many]) / (output[many] - 1)
        return ttft, tpot


def rate_at(rates: Sequence[float], values: Sequence[float], target: float) -> float:
    """The per-GPU rate where attainment falls through `target`, by linear interpolation
    between swept points (DistServe's find_intersection): the goodput per GPU. 0 when the
    lowest rate already misses; the highest rate (a lower bound) when none does."""
    if values[0] < target:
        return 0.0
    for (x0, y0), (x1, y1) in zip(
        zip(rates, values, strict=True), zip(rates[1:], values[1:], strict=True), strict=False
    ):
        if y0 >= target > y1:
            return x0 + (y0 - target) * (x1 - x0) / (y0 - y1)
    return float(rates[-1])


# -- runs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One simulation: an application, a mode and a per-GPU rate."""

    app: App
    mode: Mode
    rate: float
    requests_per_gpu: int
    engine: str | None = None


@dataclass
class Point:
    """What one run measured, kept small so it crosses a process boundary cheaply."""

    app: str
    mode: str
    rate: float
    gpus: int
    both: float  # attainment, kvsim's accounting
    both_distserve: float  # attainment, DistServe's (first token at prefill end)
    ttft_only: float
    tpot_only: float
    ttft_p50_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    goodput_tokens_per_s_per_gpu: float
    kv_mb_per_request: float
    handoff_wait_p50_s: float  # prefill end to first token (P/D only; NaN otherwise)
    busy: dict[str, float] = field(default_factory=dict)  # role -> mean busy fraction
    scaled: dict[float, float] = field(default_factory=dict)  # SLO scale -> attainment
    scaled_distserve: dict[float, float] = field(default_factory=dict)
    by_tpot: dict[float, float] = field(default_factory=dict)  # TPOT bound -> attainment
    by_tpot_distserve: dict[float, float] = field(default_factory=dict)


def config_of(job: Job) -> EngineConfig:
    """The engine config of a job: same GPU count for every mode, prefix caching off."""
    app, mode = job.app, job.mode
    settings: dict[str, object] = dict(mode.settings)
    settings.update(tp=app.tp, enable_prefix_caching=False, seed=SEED)
    if mode.pd is not None:
        settings["pd"] = f"{mode.pd[0]}:{mode.pd[1]}"
    else:
        settings["replicas"] = app.gpus // app.tp
    if job.engine is not None:
        settings["engine"] = job.engine
    return EngineConfig(**settings)  # type: ignore[arg-type]


def gpus_of(config: EngineConfig) -> int:
    """GPUs a config occupies: replicas (P + D under P/D) times TP."""
    if config.pd:
        p, d = (int(x) for x in config.pd.split(":"))
        return (p + d) * config.tp
    return (config.replicas or 1) * config.tp


def simulate_job(job: Job) -> tuple[pa.Table, dict[str, object], PrefillEnds, int]:
    """Run one job: (its requests table, its summary, its prefill ends, its GPUs)."""
    app = job.app
    config = config_of(job)
    gpus = gpus_of(config)
    n = job.requests_per_gpu * gpus
    prompt, output = lengths(app.lengths, n, SEED)
    trace = poisson_trace(prompt, output, job.rate * gpus, SEED + 1, app.name)
    model = load_model(str(DATA / f"{app.model}.toml"))
    with PrefillEnds() as ends:
        result = simulate(trace, model, load_profile(HARDWARE), config)
    summary = summarize(result, Slo(ttft_s=app.ttft_s, tpot_s=app.tpot_s))
    return result.requests, summary, ends, gpus


def run(job: Job) -> Point:
    """Simulate one job and reduce its requests table to the figures the tables show."""
    app = job.app
    t, summary, ends, gpus = simulate_job(job)
    done = t.column("status").to_numpy(zero_copy_only=False) == "completed"
    ds_ttft, ds_tpot = ends.distserve_view(t)
    kv = t.column("kv_transfer_bytes").to_numpy() if "kv_transfer_bytes" in t.column_names else 0
    wait = t.column("ttft_s").to_numpy() - ds_ttft  # 0 where nothing was handed off
    scaled, scaled_ds = {}, {}
    if job.rate == app.scale_rate:
        for s in SCALES:
            scaled[s] = attainment(t, app.ttft_s * s, app.tpot_s * s)
            scaled_ds[s] = met(done, ds_ttft, ds_tpot, app.ttft_s * s, app.tpot_s * s)
    roles: dict[str, list[float]] = {}
    for replica in summary["per_replica"]:  # type: ignore[union-attr]
        roles.setdefault(replica["role"], []).append(replica["busy_fraction"])
    busy = {role: float(np.mean(values)) for role, values in roles.items()}
    by_tpot = {b: attainment(t, app.ttft_s, b) for b in app.tpot_bounds_s}
    by_tpot_ds = {b: met(done, ds_ttft, ds_tpot, app.ttft_s, b) for b in app.tpot_bounds_s}
    return Point(
        app=app.name,
        mode=job.mode.label,
        rate=job.rate,
        gpus=gpus,
        both=attainment(t, app.ttft_s, app.tpot_s),
        both_distserve=met(done, ds_ttft, ds_tpot, app.ttft_s, app.tpot_s),
        ttft_only=attainment(t, app.ttft_s, None),
        tpot_only=attainment(t, None, app.tpot_s),
        ttft_p50_s=float(summary["ttft_p50_s"]),  # type: ignore[arg-type]
        tpot_p50_s=float(summary["tpot_p50_s"]),  # type: ignore[arg-type]
        tpot_p99_s=float(summary["tpot_p99_s"]),  # type: ignore[arg-type]
        goodput_tokens_per_s_per_gpu=float(summary["goodput_tokens_per_s"]) / gpus,  # type: ignore[arg-type]
        kv_mb_per_request=float(np.mean(kv)) / 1e6,
        handoff_wait_p50_s=float(np.nanmedian(wait)) if job.mode.pd else math.nan,
        busy=busy,
        scaled=scaled,
        scaled_distserve=scaled_ds,
        by_tpot=by_tpot,
        by_tpot_distserve=by_tpot_ds,
    )


def jobs(apps: Sequence[App], requests_per_gpu: int, engine: str | None) -> list[Job]:
    return [
        Job(app, mode, rate, requests_per_gpu, engine)
        for app in apps
        for mode in app.modes
        for rate in app.rates
    ]


#: The hand-off check: the chatbot's P/D 1:2 at 1 req/s per GPU, whole prompts against chunked.
#: With chunked prefill off a decode replica once admitted a pulled request only in an iteration
#: with nothing else scheduled (fixed in commit cf22cdf); the two waits should now agree.
CHECK_RATE = 1.0
CHECK_MODES = (
    Mode("P/D 1:2, chunked_prefill off", DISTSERVE_PD, (1, 2)),
    Mode("P/D 1:2, chunked_prefill on", dict(DISTSERVE_PD, chunked_prefill=True), (1, 2)),
)


def check_jobs(requests_per_gpu: int, engine: str | None) -> list[Job]:
    return [Job(APPS[0], m, CHECK_RATE, requests_per_gpu, engine) for m in CHECK_MODES]


def run_all(todo: list[Job], workers: int) -> list[Point]:
    """Every job, in order; over `workers` processes when more than one."""
    if workers <= 1:
        return [run(j) for j in todo]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(run, todo, chunksize=1))


# -- tables --------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


#: Attainment below which a point is overload, not service: crossovers ignore points where
#: both modes are below it.
USEFUL = 0.5
#: How far above aggregated P/D's attainment must be to count as above (one point: 100 % against
#: 99.9 % is a tie).
MARGIN = 0.01


def goodput_cell(rates: Sequence[float], values: Sequence[float]) -> str:
    """`rate_at` for a table: a bound when the curve does not cross 90 % inside the sweep."""
    if values[0] < TARGET:
        return f"< {rates[0]:g}"
    if min(values) >= TARGET:
        return f">= {rates[-1]:g}"
    return f"{rate_at(rates, values, TARGET):.3f}"


def crossover(rates: Sequence[float], pd: Sequence[float], agg: Sequence[float]) -> str:
    """The lowest swept rate from which P/D's attainment stays above aggregated's (by MARGIN),
    over the rates where either mode still serves (attainment >= USEFUL: past them both are
    overloaded and 'above' means 5 % against 3 %); "never" when there is none."""
    useful = [i for i in range(len(rates)) if max(pd[i], agg[i]) >= USEFUL]
    above = {i: pd[i] >= agg[i] + MARGIN for i in useful}
    for k, i in enumerate(useful):
        if all(above[j] for j in useful[k:]):
            return f"{rates[i]:g}"
    return "never"


def series(app: App, points: list[Point], tpot_s: float | None = None) -> dict[str, list[float]]:
    """Attainment by rate of every mode, and of each P/D mode in DistServe's accounting; at the
    paper's SLOs, or with TPOT bound `tpot_s` instead."""
    out: dict[str, list[float]] = {}
    for mode in app.modes:
        pts = [p for p in points if p.app == app.name and p.mode == mode.label]
        out[mode.label] = [p.both if tpot_s is None else p.by_tpot[tpot_s] for p in pts]
    for mode in app.modes:
        if mode.pd:
            pts = [p for p in points if p.app == app.name and p.mode == mode.label]
            out[f"{mode.label}, DistServe's TTFT"] = [
                p.both_distserve if tpot_s is None else p.by_tpot_distserve[tpot_s] for p in pts
            ]
    return out


def tighter(app: App, points: list[Point]) -> list[str]:
    """Per TPOT bound (the paper's first, TTFT kept): each mode's goodput per GPU, and the
    first rate from which the best P/D split stays above the best aggregated mode."""
    if not app.tpot_bounds_s:
        return []
    bounds: list[float | None] = [None, *app.tpot_bounds_s]
    first = series(app, points)
    labels = list(first)
    aggregated = [m.label for m in app.modes if not m.pd]
    out = [
        f"Tighter TPOT bounds (TTFT <= {app.ttft_s:g} s kept), recomputed from the same runs: "
        "goodput per GPU (req/s) of each mode, and the first swept rate from which the best P/D "
        "split stays above the best aggregated mode (kvsim's accounting / DistServe's):\n",
        "| TPOT bound | " + " | ".join(labels) + " | best P/D above best aggregated from |",
        "|---:|" + "---:|" * (len(labels) + 1),
    ]
    n = len(app.rates)
    for bound in bounds:
        curves = series(app, points, bound)
        best_agg = [max(curves[lab][i] for lab in aggregated) for i in range(n)]
        pd_kvsim = [lab for lab in labels if lab not in aggregated and "DistServe" not in lab]
        pd_ds = [lab for lab in labels if "DistServe" in lab]
        best = [max(curves[lab][i] for lab in pd_kvsim) for i in range(n)]
        best_ds = [max(curves[lab][i] for lab in pd_ds) for i in range(n)]
        cells = [goodput_cell(app.rates, curves[lab]) for lab in labels]
        shown = f"{app.tpot_s if bound is None else bound:g} s" + (
            " (paper)" if bound is None else ""
        )
        cross = (
            f"{crossover(app.rates, best, best_agg)} / {crossover(app.rates, best_ds, best_agg)}"
        )
        out.append(f"| {shown} | " + " | ".join(cells) + f" | {cross} |")
    out.append("")
    return out


def setup_table(apps: Sequence[App], engine: str | None) -> str:
    """Each mode's settings as kvsim resolves them (so a change of defaults shows here)."""
    profile = load_profile(HARDWARE)
    out = [
        "| application | mode | replicas x TP | engine | chunked prefill | prefill and decode "
        "in one iteration | token budget | max seqs | KV capacity per replica |",
        "|---|---|---|---|---|---|---:|---:|---:|",
    ]
    for app in apps:
        model = load_model(str(DATA / f"{app.model}.toml"))
        for mode in app.modes:
            config = config_of(Job(app, mode, app.rates[0], 1, engine))
            run = resolve_engine(config, model, profile)
            c = run.config
            shape = f"({mode.pd[0]} + {mode.pd[1]})" if mode.pd else f"{run.replica_count}"
            tokens = run.num_blocks * c.block_size
            chunked = "on" if c.chunked_prefill else "off"
            mixed = "yes" if c.mixed_batches else "no (prefill first)"
            out.append(
                f"| {app.name} | {mode.label} | {shape} x {c.tp} "
                f"| {run.engine.name}@{run.engine.version} | {chunked} | {mixed} "
                f"| {c.max_num_batched_tokens:,} | {c.max_num_seqs:,} | {tokens:,} tokens |"
            )
    return "\n".join(out) + "\n"


def detail(app: App, points: list[Point], rate: float) -> list[str]:
    """One rate's figures per mode, in kvsim's accounting: why each mode meets or misses."""
    out = [
        f"At {rate:g} req/s per GPU, kvsim's accounting: each objective alone, medians, p99 "
        "TPOT, goodput, how busy each role's GPUs are, the KV each P/D request pulls and its "
        "wait from prefill end to first token:\n",
        "| mode | TTFT met | TPOT met | TTFT p50 | TPOT p50 | TPOT p99 "
        "| goodput (tokens/s per GPU) | busy: prefill / decode (mixed) | KV pulled per request "
        "| hand-off wait p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in app.modes:
        pt = next(
            p for p in points if p.app == app.name and p.mode == mode.label and p.rate == rate
        )
        kv = f"{pt.kv_mb_per_request:,.0f} MB" if mode.pd else "–"
        wait = f"{1000 * pt.handoff_wait_p50_s:,.0f} ms" if mode.pd else "–"
        busy = (
            f"{_pct(pt.busy['prefill'])} / {_pct(pt.busy['decode'])}"
            if mode.pd
            else f"({_pct(pt.busy['mixed'])})"
        )
        out.append(
            f"| {mode.label} | {_pct(pt.ttft_only)} | {_pct(pt.tpot_only)} "
            f"| {pt.ttft_p50_s:.3f} s | {1000 * pt.tpot_p50_s:.0f} ms "
            f"| {1000 * pt.tpot_p99_s:.0f} ms | {pt.goodput_tokens_per_s_per_gpu:,.0f} "
            f"| {busy} | {kv} | {wait} |"
        )
    out.append("")
    return out


def tables(apps: Sequence[App], points: list[Point], check: Sequence[Point] = ()) -> str:
    """The Markdown block: per application, attainment vs rate, the summary, the SLO scales."""
    out: list[str] = []
    for app in apps:
        curves = series(app, points)
        labels = list(curves)
        aggregated = [m.label for m in app.modes if not m.pd]
        best_agg = [max(curves[lab][i] for lab in aggregated) for i in range(len(app.rates))]
        out.append(
            f"#### {app.name}: {app.model} on {app.gpus} GPUs ({HARDWARE}), "
            f"TTFT <= {app.ttft_s:g} s and TPOT <= {app.tpot_s:g} s\n"
        )
        out.append("SLO attainment (both objectives met) by per-GPU rate:\n")
        out.append("| per-GPU rate (req/s) | " + " | ".join(labels) + " |")
        out.append("|---:|" + "---:|" * len(labels))
        for i, rate in enumerate(app.rates):
            out.append(f"| {rate:g} | " + " | ".join(_pct(curves[lab][i]) for lab in labels) + " |")
        out.append("")
        out.append(
            "Goodput per GPU (the per-GPU rate where attainment falls through 90 %, DistServe's "
            "measure, interpolated between swept rates; a bound when it does so outside the "
            "sweep) and, for P/D, the first swept "
            "rate from which it stays above DistServe's vLLM baseline and above every aggregated "
            f"mode by at least {MARGIN:.0%} (over the rates where either attains {USEFUL:.0%}):\n"
        )
        out.append(
            "| mode | goodput per GPU (req/s) | above the baseline from "
            "| above every aggregated mode from |"
        )
        out.append("|---|---:|---:|---:|")
        base = curves[aggregated[0]]
        for lab in labels:
            good = goodput_cell(app.rates, curves[lab])
            if lab in aggregated:
                out.append(f"| {lab} | {good} | – | – |")
                continue
            out.append(
                f"| {lab} | {good} | {crossover(app.rates, curves[lab], base)} "
                f"| {crossover(app.rates, curves[lab], best_agg)} |"
            )
        out.append("")
        out.extend(tighter(app, points))
        for rate in (app.scale_rate, app.rates[-1]):
            out.extend(detail(app, points, rate))
        out.append(
            f"SLO attainment at {app.scale_rate:g} req/s per GPU with both objectives scaled "
            "(DistServe's SLO-scale sweep; below 1 is tighter):\n"
        )
        out.append("| SLO scale | " + " | ".join(labels) + " |")
        out.append("|---:|" + "---:|" * len(labels))
        at = {}
        for mode in app.modes:
            pt = next(
                p
                for p in points
                if p.app == app.name and p.mode == mode.label and p.rate == app.scale_rate
            )
            at[mode.label] = pt.scaled
            if mode.pd:
                at[f"{mode.label}, DistServe's TTFT"] = pt.scaled_distserve
        for s in SCALES:
            out.append(f"| {s:g} | " + " | ".join(_pct(at[lab][s]) for lab in labels) + " |")
        out.append("")
    if check:
        out.append(
            f"Hand-off check ({APPS[0].name}, {CHECK_RATE:g} req/s per GPU): median wait from "
            "prefill end to first token, and attainment, with the P/D replicas' chunked prefill "
            "off and on:\n"
        )
        out.append("| P/D setting | hand-off wait p50 | SLO attainment |")
        out.append("|---|---:|---:|")
        for pt in check:
            out.append(f"| {pt.mode} | {1000 * pt.handoff_wait_p50_s:,.0f} ms | {_pct(pt.both)} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def plot(apps: Sequence[App], points: list[Point], path: Path) -> None:
    """Attainment against per-GPU rate: a column per application, the paper's SLOs on top and
    a tighter TPOT bound below; every mode a line (P/D solid, in DistServe's TTFT accounting
    dotted, aggregated dashed; the baseline drawn wide, as kvsim's defaults often equal it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(apps), figsize=(6.5 * len(apps), 8.4), squeeze=False)
    for col, app in enumerate(apps):
        for row, bound in enumerate((None, app.plot_tpot_s)):
            ax = axes[row][col]
            if row and bound is None:
                ax.set_visible(False)
                continue
            curves = series(app, points, bound)
            for k, (label, values) in enumerate(curves.items()):
                pd = label.startswith("P/D")
                ax.plot(
                    app.rates,
                    [100 * v for v in values],
                    ":" if "DistServe's TTFT" in label else ("-" if pd else "--"),
                    marker="o" if pd else "s",
                    markersize=4,
                    linewidth=4 if k == 0 else 1.5,
                    alpha=0.45 if k == 0 else 1.0,
                    label=label,
                )
            ax.axhline(100 * TARGET, color="grey", linestyle=":", linewidth=1)
            tpot = app.tpot_s if bound is None else bound
            ax.set_title(
                f"{app.name}: {app.model}, {app.gpus} x A100, TTFT {app.ttft_s:g} s, "
                f"TPOT {tpot:g} s{' (paper)' if bound is None else ''}",
                fontsize=10,
            )
            ax.set_xlabel("per-GPU rate (req/s)")
            ax.set_ylabel("SLO attainment (%)")
            ax.set_ylim(0, 105)
            ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markers(engine: str | None) -> tuple[str, str]:
    """The doc block a run writes: the default engine's, or a block of its own per engine."""
    if engine is None:
        return DOC_BEGIN, DOC_END
    name = f"pd_vs_aggregated.py --engine {engine}"
    return (
        f"<!-- {name}: generated below, do not edit by hand -->",
        f"<!-- {name}: generated above -->",
    )


def update_doc(text: str, path: Path = DOC, engine: str | None = None) -> None:
    """Replace the block between the markers of `engine`'s run in `path` with `text`."""
    begin, finish = markers(engine)
    doc = path.read_text(encoding="utf-8")
    start, end = doc.find(begin), doc.find(finish)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: markers {begin!r} ... {finish!r} not found")
    new = doc[: start + len(begin)] + "\n\n" + text + "\n" + doc[end:]
    path.write_text(new, encoding="utf-8")


def quick(apps: Sequence[App]) -> tuple[App, ...]:
    """Every other rate (the scale rate kept), for a run of a minute or so."""
    out = []
    for app in apps:
        rates = tuple(sorted(set(app.rates[::2]) | {app.scale_rate}))
        out.append(dataclasses.replace(app, rates=rates))
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rates and requests")
    parser.add_argument(
        "--requests-per-gpu",
        type=int,
        help="requests per GPU and point (default 200; 60 with --quick; DistServe ran 100 "
        "for the chatbot and 25 for summarization)",
    )
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--engine", help="kvsim engine profile for every run (default: kvsim's)")
    parser.add_argument(
        "--update-doc",
        action="store_true",
        help="rewrite docs/disaggregation.md's block and its PNG (with --engine: that engine's "
        "block of goodput tables)",
    )
    args = parser.parse_args(argv)
    apps = quick(APPS) if args.quick else APPS
    per_gpu = args.requests_per_gpu or (60 if args.quick else 200)
    todo = jobs(apps, per_gpu, args.engine)
    checks = check_jobs(per_gpu, args.engine)
    done = run_all(todo + checks, args.jobs)
    points, check = done[: len(todo)], done[len(todo) :]
    text = setup_table(apps, args.engine) + "\n" + tables(apps, points, check)
    header = (
        f"_{per_gpu} requests per GPU and point, seed {SEED}; `python "
        f"benchmarks/pd_vs_aggregated.py{' --quick' if args.quick else ''}"
        f"{f' --engine {args.engine}' if args.engine else ''}`._\n\n"
    )
    sys.stdout.write(header + text)
    if args.update_doc and args.engine is None:
        update_doc(header + text)
        plot(apps, points, PLOT)
    elif args.update_doc:  # another engine: its goodput tables only, in a block of its own
        short = "\n".join(line for app in apps for line in tighter(app, points))
        update_doc(header + short, engine=args.engine)


if __name__ == "__main__":
    main()

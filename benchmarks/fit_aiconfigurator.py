"""Fit kvsim's kernel terms per GPU and serving engine to NVIDIA's AIConfigurator kernel database.

    python benchmarks/fit_aiconfigurator.py --markdown           # the full wheel (see --data)
    python benchmarks/fit_aiconfigurator.py --update-doc --write-profiles

The ``aiconfigurator-core`` wheel (0.12.0, Apache-2.0) ships per-kernel latencies measured under
vLLM, SGLang and TensorRT-LLM on each GPU, timed by CUDA-graph replay (see docs/validation.md,
"Kernels: NVIDIA's AIConfigurator database"). For every GPU the data covers and kvsim has a
profile for, and every engine measured on it, this script fits on half the shapes and reports
the other half:

- BF16 GEMMs (``2mnk`` FLOPs, ``(mk + kn + mn) x 2`` bytes): compute and memory efficiency, the
  ridge sharpness ``p`` and the floor per kernel (memory efficiency is fitted, not held);
- prefill attention (context_attention, BF16 KV): attention FLOP efficiency, the chunk length
  at which it reaches half of that (``attention_ramp_tokens``) and the floor per layer, at the
  GEMMs' memory efficiency and ridge; the single efficiency of the earlier fit is refitted beside
  it for comparison;
- decode attention (generation_attention, BF16 KV): the share of HBM bandwidth it reaches, its
  floor per layer and its cost per sequence per layer, at the prefill FLOP efficiency and the
  GEMMs' ridge (the earlier fit without the per-sequence cost beside it);
- all-reduce: the engine's own graph-mode all-reduce below its size limit (``custom``) and NCCL
  (nccl-tests), each latency + latency per extra GPU + bus bandwidth.

The work of each kernel comes from kvsim's own sizing (``kvsim.models.attention_costs`` on a
one-layer model of the measured head shape, ``kvsim.hardware.attention_pairs``), so the terms
are fitted in the units the cost model uses. Shapes are split alternately over sorted distinct
shapes ((n, k) for GEMMs; heads, KV heads, head dim, window and length for attention; message
size for all-reduce), so a held-out shape is one the fit never saw. The same held-out points
are priced with the profile's current terms (fitted to Vidur's 2024 eager kernels) to show what
moved. Errors are (kvsim - measured) / measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.calibrate.aiconfigurator_data import KernelDatabase, open_database
from kvsim.calibrate.aiconfigurator_import import GPU_PROFILES
from kvsim.calibrate.kernel_fit import (
    AllReducePoints,
    KernelFit,
    KernelPoints,
    error_summary,
    nelder_mead,
    predict_allreduce,
)
from kvsim.costmodel.kernels import blend
from kvsim.hardware import load_profile
from kvsim.hardware.attention_pairs import causal_pairs, windowed_pairs
from kvsim.hardware.profile import AllReduceAlgorithm, HardwareProfile
from kvsim.models.sizing import attention_costs
from kvsim.models.spec import LayerGroup, ModelSpec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIPPED = HERE / "data" / "aiconfigurator"
WHEEL = Path("/tmp/aic/x")
ENV = "KVSIM_AICONFIGURATOR"
DOC = ROOT / "docs" / "validation.md"
PROFILES_DIR = ROOT / "hardware_profiles"
BEGIN = "<!-- fit_aiconfigurator.py: generated below -->"
END = "<!-- fit_aiconfigurator.py: generated above -->"
TOML_BEGIN = "# fit_aiconfigurator.py: engine kernel terms below (generated; edit the script)"
TOML_END = "# fit_aiconfigurator.py: engine kernel terms above"

#: AIConfigurator's system name -> kvsim's hardware profile (the importer's table).
GPUS = GPU_PROFILES
ENGINES = ("vllm", "sglang", "trtllm")
BF16 = 2.0
MIB = 1024 * 1024
#: The largest message each engine's own all-reduce takes; larger ones go to NCCL.
CUSTOM_MAX_BYTES = {
    "vllm": 8 * MIB,
    "sglang": 8 * MIB,
    "trtllm": 8 * MIB,
}
CUSTOM_MAX_SOURCE = {
    "vllm": "assumption: vLLM's default, from its source: vllm/distributed/device_communicators/"
    "custom_all_reduce.py: CustomAllreduce(max_size=8192 * 1024), taken while the input is "
    "smaller (should_custom_ar); NCCL above",
    "sglang": "assumption: SGLang's default, from its source: python/sglang/srt/distributed/"
    "device_communicators/custom_all_reduce.py: CustomAllreduce._MAX_CAR_SIZE = 8192 * 1024 "
    "on CUDA, taken while the input is smaller (should_custom_ar); NCCL above",
    "trtllm": "assumption: the 8 MiB of vLLM's; TensorRT-LLM's table meets NCCL's at 16-32 MiB",
}
#: Fit rows kept per family (every k-th of the sorted fit half): Nelder-Mead on ~35k GEMMs takes
#: ~10 s a fit on two cores and gains nothing over a regular thinning.
MAX_FIT_ROWS = 4000


@dataclass(frozen=True)
class Terms:
    """The kernel terms one GPU x engine gets: [engines.E] in the hardware profile."""

    compute: float
    memory: float
    ridge_sharpness: float
    kernel_floor_s: float
    attention: float
    attention_ramp_tokens: float
    attention_floor_s: float
    decode_attention: float
    decode_attention_floor_s: float
    decode_attention_per_sequence_s: float
    allreduce: tuple[AllReduceAlgorithm, ...]


# --------------------------------------------------------------------------------------------
# work of one measured kernel, in kvsim's units


def gemm_points(df: pd.DataFrame) -> KernelPoints:
    """BF16 GEMMs: FLOPs ``2mnk``, bytes of A, B and C once each."""
    m, n, k = (df[c].to_numpy(np.float64) for c in ("m", "n", "k"))
    ones = np.ones_like(m)
    return KernelPoints(2 * m * n * k, (m * k + k * n + m * n) * BF16, ones, _seconds(df))


def _seconds(df: pd.DataFrame) -> np.ndarray:
    return df["latency_s"].to_numpy(np.float64)


@dataclass(frozen=True)
class AttentionPoints(KernelPoints):
    """Attention kernels, with what the length and batch terms need per measured kernel: the new
    tokens of each chunk (prefill: the prompt; decode: 1) and the sequences in the batch."""

    new_tokens: np.ndarray
    sequences: np.ndarray

    def take(self, mask: np.ndarray) -> AttentionPoints:
        k = super().take(mask)
        return AttentionPoints(
            k.flops, k.nbytes, k.kernels, k.seconds, self.new_tokens[mask], self.sequences[mask]
        )


@functools.cache
def _head_cost(heads: int, kv_heads: int, head_dim: int, window: int) -> tuple[float, float]:
    """(FLOPs per query-key pair, KV bytes per token) of one layer of this head shape, from
    kvsim's own sizing of a one-layer model (BF16 KV)."""
    kind = "sliding" if window else "full"
    group = LayerGroup(kind, 1, heads, kv_heads, head_dim, head_dim, window=window or None)
    spec = ModelSpec("aic", "aic", heads * head_dim, 1, 1, heads, False, (group,), ())
    (cost,) = attention_costs(spec, "bf16", 1)
    return cost.prefill_flops_per_token_pair, cost.kv_bytes_per_token


def _shape_columns(df: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    cols = ("num_heads", "num_kv_heads", "head_dim", "window")
    return list(zip(*(df[c].astype(int) for c in cols), strict=True))


def prefill_points(df: pd.DataFrame) -> AttentionPoints:
    """Context attention: ``batch`` prompts of ``isl`` tokens, no cached context."""
    flops, nbytes = [], []
    for (h, kvh, d, w), b, s in zip(_shape_columns(df), df["batch"], df["isl"], strict=True):
        per_pair, kv_per_token = _head_cost(h, kvh, d, w)
        pairs = windowed_pairs(0, int(s), w) if w else causal_pairs(s, 0)
        flops.append(b * pairs * per_pair)
        nbytes.append(b * s * kv_per_token)  # the chunk's KV written (roofline: read + new)
    ones = np.ones(len(df))
    isl, batch = (df[c].to_numpy(np.float64) for c in ("isl", "batch"))
    return AttentionPoints(np.array(flops), np.array(nbytes), ones, _seconds(df), isl, batch)


#: Sliding windows shorter than this are left out of the prefill fit and reported apart: the
#: kernels work in 128-token tiles, so a 128-token band costs several times its (query, key)
#: pairs (FlashAttention-3 on H100 reaches 7-11 % of peak there against 30-50 % unwindowed),
#: and kvsim's pair count cannot see that.
MIN_PREFILL_WINDOW = 1024
#: Prompt lengths the prefill rows are also reported by (held out only, full-size windows).
PROMPT_BANDS = ((1, 512), (512, 2048), (2048, 8192), (8192, 1 << 30))


def in_prefill_domain(df: pd.DataFrame) -> np.ndarray:
    """Rows the prefill terms are fitted to: full attention, or windows of at least
    ``MIN_PREFILL_WINDOW`` tokens."""
    w = df["window"].to_numpy()
    return (w == 0) | (w >= MIN_PREFILL_WINDOW)


def decode_context(df: pd.DataFrame) -> np.ndarray:
    """Tokens each sequence attends to in one decode step: ``isl + step``, within the window."""
    ctx = df["context_tokens"].to_numpy(np.float64)
    w = df["window"].to_numpy(np.float64)
    return np.where(w > 0, np.minimum(ctx, np.where(w > 0, w, 1.0)), ctx)


def decode_points(df: pd.DataFrame) -> AttentionPoints:
    """Generation attention: ``batch`` sequences each reading their whole (windowed) KV."""
    batch = df["batch"].to_numpy(np.float64)
    attended = batch * decode_context(df)
    costs = np.array([_head_cost(*s) for s in _shape_columns(df)]).reshape(-1, 2)
    ones = np.ones(len(df))
    flops, nbytes = attended * costs[:, 0], attended * costs[:, 1]
    return AttentionPoints(flops, nbytes, ones, _seconds(df), ones, batch)


# --------------------------------------------------------------------------------------------
# splits and fits


def alternate(keys: list[tuple]) -> np.ndarray:
    """True for rows whose key is an even one of the sorted distinct keys: the fit half."""
    order = {k: i for i, k in enumerate(sorted(set(keys)))}
    return np.array([order[k] % 2 == 0 for k in keys], dtype=bool)


def thin(p: KernelPoints, limit: int = MAX_FIT_ROWS) -> KernelPoints:
    """Every k-th point, so at most ``limit`` (the fit is a mean over the points anyway)."""
    step = max(1, math.ceil(p.seconds.size / limit))
    return p.take(np.arange(p.seconds.size) % step == 0)


def log_l1(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean |log(predicted / measured)|: the fit's loss. A median-like loss, so the shapes whose
    cost the kernel model cannot represent (see the docstring of ``PREFILL_DOMAIN``) pull the
    terms less than a squared loss lets them."""
    return float(np.mean(np.abs(np.log(predicted / measured))))


def minimise(loss, x0: list[float]) -> np.ndarray:
    """Nelder-Mead over log-parameters from ``x0``, restarted once with a smaller step."""
    x = nelder_mead(loss, np.log(np.array(x0)))
    return nelder_mead(loss, x, step=0.1)


def fit_gemm(p: KernelPoints, peak_flops: float, peak_bytes: float) -> KernelFit:
    """Compute and memory efficiency (each <= 1), ridge sharpness (> 1) and floor per kernel."""

    def unpack(x: np.ndarray) -> KernelFit:
        return KernelFit(
            min(1.0, math.exp(x[0])), min(1.0, math.exp(x[1])), 1.0 + math.exp(x[2]), math.exp(x[3])
        )

    x = minimise(lambda x: log_l1(unpack(x).predict(p, peak_flops, peak_bytes), p.seconds),
                 [0.7, 0.8, 1.0, 3e-6])  # fmt: skip
    return unpack(x)


@dataclass(frozen=True)
class PrefillFit:
    """Prefill attention as kvsim.costmodel.kernels prices one chunk of ``n`` new tokens: its
    FLOPs scaled by ``(n + ramp_tokens) / n`` (KernelRates.prefill_flops_at_peak_rate), then
    the soft roofline at the FLOP efficiency long chunks reach, plus a floor per layer."""

    compute: float
    memory: float
    ridge: float
    floor_s: float
    ramp_tokens: float = 0.0

    def predict(self, p: AttentionPoints, peak_flops: float, peak_bytes: float) -> np.ndarray:
        flops = p.flops * (p.new_tokens + self.ramp_tokens) / p.new_tokens
        c = flops / (peak_flops * self.compute)
        m = p.nbytes / (peak_bytes * self.memory)
        return p.kernels * self.floor_s + blend(c, m, self.ridge)


def fit_prefill(
    p: AttentionPoints, peak_flops: float, peak_bytes: float, gemm: KernelFit, ramp: bool = True
) -> PrefillFit:
    """Prefill attention's FLOP efficiency, ramp length (``ramp=False``: none, the single
    efficiency of the earlier fit) and floor per layer, at the GEMMs' memory efficiency and
    ridge."""

    def unpack(x: np.ndarray) -> PrefillFit:
        ramp_tokens = math.exp(x[2]) if ramp else 0.0
        return PrefillFit(
            min(1.0, math.exp(x[0])), gemm.memory, gemm.ridge, math.exp(x[1]), ramp_tokens
        )

    x0 = [0.5, 1e-5, 1000.0] if ramp else [0.5, 1e-5]
    x = minimise(lambda x: log_l1(unpack(x).predict(p, peak_flops, peak_bytes), p.seconds), x0)
    return unpack(x)


@dataclass(frozen=True)
class DecodeFit:
    """Decode attention (KernelRates.decode_attention_s): its bandwidth share, floor per layer
    and cost per sequence per layer, at the prefill FLOP rate and ridge."""

    attention: float
    decode_attention: float
    ridge: float
    floor_s: float
    per_sequence_s: float = 0.0

    def predict(self, p: AttentionPoints, peak_flops: float, peak_bytes: float) -> np.ndarray:
        c = p.flops / (peak_flops * self.attention)
        m = p.nbytes / (peak_bytes * self.decode_attention)
        fixed = p.kernels * (self.floor_s + p.sequences * self.per_sequence_s)
        return fixed + blend(c, m, self.ridge)


def fit_decode(
    p: AttentionPoints,
    peak_flops: float,
    peak_bytes: float,
    attention: float,
    ridge: float,
    per_sequence: bool = True,
) -> DecodeFit:
    """Decode attention's share of HBM bandwidth (<= 1), floor per layer and cost per sequence
    per layer (``per_sequence=False``: none, the earlier fit)."""

    def unpack(x: np.ndarray) -> DecodeFit:
        seq = math.exp(x[2]) if per_sequence else 0.0
        return DecodeFit(attention, min(1.0, math.exp(x[0])), ridge, math.exp(x[1]), seq)

    x0 = [0.7, 1e-5, 1e-8] if per_sequence else [0.7, 1e-5]
    x = minimise(lambda x: log_l1(unpack(x).predict(p, peak_flops, peak_bytes), p.seconds), x0)
    return unpack(x)


def fit_allreduce_l1(p: AllReducePoints, name: str) -> AllReduceAlgorithm:
    """Latency, latency per extra GPU and bus bandwidth over every group size measured."""

    def unpack(x: np.ndarray) -> AllReduceAlgorithm:
        return AllReduceAlgorithm(name, math.exp(x[0]), math.exp(x[1]), math.exp(x[2]))

    x = minimise(lambda x: log_l1(predict_allreduce(unpack(x), p), p.seconds),
                 [10e-6, 1e-6, 300e9])  # fmt: skip
    return unpack(x)


def allreduce_points(df: pd.DataFrame) -> AllReducePoints:
    return AllReducePoints(
        df["num_gpus"].to_numpy(np.float64),
        df["message_bytes"].to_numpy(np.float64),
        _seconds(df),
    )


def predict_algorithms(algs: tuple[AllReduceAlgorithm, ...], p: AllReducePoints) -> np.ndarray:
    """kvsim's choice: the cheapest algorithm that takes the message (``max_bytes``)."""
    best = np.full(p.seconds.size, np.inf)
    for a in algs:
        t = predict_allreduce(a, p)
        ok = p.gpus >= a.min_gpus
        if a.max_bytes is not None:
            ok &= p.nbytes < a.max_bytes
        best = np.where(ok, np.minimum(best, t), best)
    if np.isinf(best).any():  # nothing applies: the first algorithm, as kvsim falls back
        best = np.where(np.isinf(best), predict_allreduce(algs[0], p), best)
    return best


def with_max_bytes(a: AllReduceAlgorithm, max_bytes: float | None) -> AllReduceAlgorithm:
    """``a`` limited to messages below ``max_bytes`` (AllReduceAlgorithm.max_bytes)."""
    return replace(a, max_bytes=max_bytes)


# --------------------------------------------------------------------------------------------
# the database


def data_root(arg: Path | None) -> tuple[Path, str]:
    """Where the AIConfigurator data is, and which copy that is (for the report)."""
    if arg is not None:
        return arg, f"--data {arg}"
    if os.environ.get(ENV):
        return Path(os.environ[ENV]), f"${ENV}={os.environ[ENV]}"
    if WHEEL.exists():
        return WHEEL, f"the extracted wheel at {WHEEL}"
    return SHIPPED, f"the shipped subset at {SHIPPED.relative_to(ROOT)}"


def open_db(root: Path) -> KernelDatabase:
    """kvsim.calibrate.aiconfigurator_data's reader over ``root``."""
    return open_database(root)


#: The table each family reads, for reporting its version.
TABLES = {
    "gemm": ("gemm", "gemm_perf.parquet"),
    "context attention": ("attention", "context_attention_perf.parquet"),
    "generation attention": ("attention", "generation_attention_perf.parquet"),
    "all-reduce": ("comm", "custom_allreduce_perf.parquet"),
}


def has_table(db: KernelDatabase, gpu: str, engine: str, family: str) -> bool:
    folder, table = TABLES[family]
    return bool(db.versions(gpu, folder, engine, table))


def versions(db: KernelDatabase, gpu: str, engine: str) -> dict[str, str]:
    """The version of each table read (the reader takes the newest)."""
    out = {}
    for family, (folder, table) in TABLES.items():
        have = db.versions(gpu, folder, engine, table)
        if have:
            out[family] = f"{engine} {have[-1]}"
    nccl = db.versions(gpu, "comm", "nccl", "nccl_perf.parquet")
    if nccl:
        out["nccl"] = f"NCCL {nccl[-1]}"
    return out


def _bf16(df: pd.DataFrame, column: str) -> pd.DataFrame:
    return df[df[column].astype(str).isin(("bfloat16", "bf16"))]


def allreduce_tables(
    db: KernelDatabase, gpu: str, engine: str
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(the engine's graph-mode all-reduce, NCCL's 16-bit all-reduce) on ``gpu``."""
    if not has_table(db, gpu, engine, "all-reduce") and not db.versions(
        gpu, "comm", "nccl", "nccl_perf.parquet"
    ):
        return None, None
    df = db.allreduce(gpu, engine)
    df = df[df["dtype"].isin(("half", "bfloat16", "float16", "fp16"))]
    custom = df[~df["implementation"].isin(("nccl", "custom_eager"))]
    nccl = df[df["implementation"] == "nccl"]
    return (custom if len(custom) else None), (nccl if len(nccl) else None)


# --------------------------------------------------------------------------------------------
# one GPU x engine


def current_terms(profile: HardwareProfile) -> tuple[KernelFit, PrefillFit, DecodeFit]:
    """The profile's [efficiency] as GEMM, prefill and (old single-term) decode attention."""
    e = profile.efficiency
    gemm = KernelFit(e.compute, e.memory, e.ridge_sharpness, e.kernel_floor_s)
    ramp = e.attention_ramp_tokens or 0.0
    att = PrefillFit(e.attention_or_compute, e.memory, e.ridge_sharpness, e.attention_floor_s, ramp)
    dec = DecodeFit(e.attention_or_compute, e.memory, e.ridge_sharpness, e.attention_floor_s)
    return gemm, att, dec


def _rows(
    family: str,
    p: KernelPoints,
    fit_mask: np.ndarray,
    fitted,
    current,
    halves: tuple[str, ...] = ("fit", "held out"),
    earlier=None,
) -> list[dict]:
    """Error rows of one family: the fitted, the current and (for attention) the earlier fit's
    form of terms on each half asked for."""
    out = []
    for half, mask in (("fit", fit_mask), ("held out", ~fit_mask)):
        if not mask.any() or half not in halves:
            continue
        q = p.take(mask)
        row = {"family": family, "half": half, "fitted": error_summary(fitted(q), q.seconds)}
        row["current"] = error_summary(current(q), q.seconds) if current else None
        row["earlier"] = error_summary(earlier(q), q.seconds) if earlier else None
        out.append(row)
    return out


def fit_engine(db: KernelDatabase, gpu: str, engine: str, profile: HardwareProfile) -> dict | None:
    """Every family's fit and errors for one GPU x engine, or None without GEMM data."""
    if not has_table(db, gpu, engine, "gemm"):
        return None
    gemm_df = _bf16(db.gemm(gpu, engine), "dtype")
    peak = profile.gpu.peak_flops_per_s["bf16"]
    bw = profile.gpu.hbm_bandwidth_bytes_per_s
    cur_gemm, cur_att, cur_dec = current_terms(profile)
    rows: list[dict] = []

    g = gemm_points(gemm_df)
    gmask = alternate(list(zip(gemm_df["n"], gemm_df["k"], strict=True)))
    gfit = fit_gemm(thin(g.take(gmask)), peak, bw)
    rows += _rows(
        "GEMM",
        g,
        gmask,
        lambda q: gfit.predict(q, peak, bw),
        lambda q: cur_gemm.predict(q, peak, bw),
    )

    att, att_ramp, att_floor = cur_att.compute, cur_att.ramp_tokens, cur_att.floor_s
    single_att = att
    ctx = None
    if has_table(db, gpu, engine, "context attention"):
        ctx = _bf16(db.context_attention(gpu, engine), "kv_dtype")
        a = prefill_points(ctx)
        amask = alternate([(*s, i) for s, i in zip(_shape_columns(ctx), ctx["isl"], strict=True)])
        domain = in_prefill_domain(ctx)
        fit_points = thin(a.take(amask & domain))
        afit = fit_prefill(fit_points, peak, bw, gfit)
        single = fit_prefill(fit_points, peak, bw, gfit, ramp=False)  # the earlier fit's form
        att, att_ramp, att_floor = afit.compute, afit.ramp_tokens, afit.floor_s
        single_att = single.compute
        isl = ctx["isl"].to_numpy()
        parts = [("prefill attention", domain)]
        for lo, hi in PROMPT_BANDS:  # held-out rows by prompt length: where one term missed
            parts.append((_band_family(lo, hi), domain & (isl >= lo) & (isl < hi)))
        parts.append((f"prefill attention, windows < {MIN_PREFILL_WINDOW} (not fitted)", ~domain))
        for family, keep in parts:
            if keep.any():
                rows += _rows(
                    family,
                    a.take(keep),
                    amask[keep],
                    lambda q: afit.predict(q, peak, bw),
                    lambda q: cur_att.predict(q, peak, bw),
                    halves=("fit", "held out") if keep is domain else ("held out",),
                    earlier=lambda q: single.predict(q, peak, bw),
                )

    dec, dec_floor, dec_seq = None, None, 0.0
    gen = None
    if has_table(db, gpu, engine, "generation attention"):
        gen = _bf16(db.generation_attention(gpu, engine), "kv_dtype")
        d = decode_points(gen)
        dmask = alternate(
            [(*s, c) for s, c in zip(_shape_columns(gen), decode_context(gen), strict=True)]
        )
        fit_points = thin(d.take(dmask))
        dfit = fit_decode(fit_points, peak, bw, att, gfit.ridge)
        # the earlier fit's form: no per-sequence cost, at the single prefill efficiency
        dold = fit_decode(fit_points, peak, bw, single_att, gfit.ridge, per_sequence=False)
        dec, dec_floor, dec_seq = dfit.decode_attention, dfit.floor_s, dfit.per_sequence_s
        rows += _rows(
            "decode attention",
            d,
            dmask,
            lambda q: dfit.predict(q, peak, bw),
            lambda q: cur_dec.predict(q, peak, bw),
            earlier=lambda q: dold.predict(q, peak, bw),
        )

    algs: list[AllReduceAlgorithm] = []
    custom, nccl = allreduce_tables(db, gpu, engine)
    current_ar = profile.allreduce_algorithms
    for name, df, limit in (("custom", custom, CUSTOM_MAX_BYTES[engine]), ("nccl", nccl, None)):
        if df is None:
            continue
        if limit is not None:
            df = df[df["message_bytes"] < limit]
        p = allreduce_points(df)
        mask = alternate([(b,) for b in df["message_bytes"]])
        fitted = with_max_bytes(fit_allreduce_l1(p.take(mask), name), limit)
        algs.append(fitted)
        rows += _rows(
            f"all-reduce {name}",
            KernelPoints(p.nbytes, p.nbytes, p.gpus, p.seconds),
            mask,
            lambda q, a=fitted: predict_allreduce(a, _ar(q)),
            lambda q: predict_algorithms(current_ar, _ar(q)),
        )
    if custom is not None and algs:  # the engine's whole table, priced as kvsim picks
        p = allreduce_points(custom)
        mask = alternate([(b,) for b in custom["message_bytes"]])
        rows += _rows(
            "all-reduce as the engine runs it",
            KernelPoints(p.nbytes, p.nbytes, p.gpus, p.seconds),
            mask,
            lambda q: predict_algorithms(tuple(algs), _ar(q)),
            lambda q: predict_algorithms(current_ar, _ar(q)),
        )
    terms = Terms(
        gfit.compute,
        gfit.memory,
        gfit.ridge,
        gfit.floor_s,
        att,
        att_ramp,
        att_floor,
        dec if dec is not None else gfit.memory,
        dec_floor if dec_floor is not None else att_floor,
        dec_seq,
        tuple(algs),
    )
    return {
        "gpu": gpu,
        "engine": engine,
        "profile": profile.name,
        "versions": versions(db, gpu, engine),
        "terms": terms,
        "measured": {"prefill": ctx is not None, "decode": gen is not None},
        "rows": rows,
    }


def _ar(q: KernelPoints) -> AllReducePoints:
    """All-reduce points carried through KernelPoints (bytes in ``nbytes``, GPUs in
    ``kernels``) so that one row builder serves every family."""
    return AllReducePoints(q.kernels, q.nbytes, q.seconds)


# --------------------------------------------------------------------------------------------
# output


def _pct(x: float) -> str:
    return f"{x:.1%}" if abs(x) < 1 else f"{x:.0%}"


def _us(s: float) -> str:
    return f"{s * 1e6:.3g}us"


def _gbs(b: float) -> str:
    return f"{b / 1e9:.4g}GB/s"


def _held_out(r: dict, family: str) -> dict | None:
    return next((x for x in r["rows"] if x["family"] == family and x["half"] == "held out"), None)


def _band_family(lo: int, hi: int) -> str:
    band = f"{lo}-{hi - 1}" if hi < 1 << 30 else f">= {lo}"
    return f"prefill attention, {band} tokens"


def markdown(results: list[dict], source: str) -> str:
    """The held-out summary, the prefill rows by prompt length, the fitted terms and one table
    per GPU x engine."""
    lines = [f"Data: {source}.", ""]
    families = ("GEMM", "prefill attention", "decode attention", "all-reduce as the engine runs it")
    lines += [
        "Held-out median |error| of the fitted terms (in brackets: the current [efficiency] and "
        "[[allreduce]] terms, fitted to Vidur's eager kernels, on the same points; for attention "
        "also the earlier fit's form: one prefill FLOP efficiency, no decode cost per sequence):",
        "",
        "| GPU | engine | "
        + " | ".join(families)
        + " | prefill, one efficiency | decode, no per-sequence cost |",
        "|---|---|" + "---|" * (len(families) + 2),
    ]
    for r in results:
        cells = []
        for fam in families:
            row = _held_out(r, fam)
            if row is None:
                cells.append("—")
                continue
            cur = row["current"]
            cells.append(
                f"{_pct(row['fitted']['median_abs'])} ({_pct(cur['median_abs'])})"
                if cur
                else _pct(row["fitted"]["median_abs"])
            )
        for fam in ("prefill attention", "decode attention"):
            row = _held_out(r, fam)
            cells.append(_pct(row["earlier"]["median_abs"]) if row and row["earlier"] else "—")
        lines.append(f"| {r['profile']} | {r['engine']} | " + " | ".join(cells) + " |")
    bands = [_band_family(lo, hi) for lo, hi in PROMPT_BANDS]
    lines += [
        "",
        "Prefill attention held out, by prompt length: median bias (kvsim - measured) / measured "
        "of the fitted terms with `attention_ramp_tokens`, and in brackets of one FLOP "
        "efficiency fitted the earlier way on the same points:",
        "",
        "| GPU | engine | " + " | ".join(b.split(", ")[1] for b in bands) + " |",
        "|---|---|" + "---|" * len(bands),
    ]
    for r in results:
        cells = []
        for fam in bands:
            row = _held_out(r, fam)
            if row is None:
                cells.append("—")
                continue
            new, old = row["fitted"]["bias"], row["earlier"]["bias"]
            cells.append(f"{new:+.1%} ({old:+.1%})")
        lines.append(f"| {r['profile']} | {r['engine']} | " + " | ".join(cells) + " |")
    lines += ["", "Fitted terms (`[engines.E]` in each hardware profile):", ""]
    lines += [
        "| GPU | engine | compute | memory | p | kernel floor | attention | attention ramp | "
        "attention floor | decode attention | decode floor | decode per sequence | "
        "custom all-reduce: latency / per GPU / bus | NCCL: latency / per GPU / bus |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t: Terms = r["terms"]
        ar = {a.name: a for a in t.allreduce}

        def cell(name: str, ar: dict[str, AllReduceAlgorithm] = ar) -> str:
            a = ar.get(name)
            if a is None:
                return "—"
            bus = _gbs(a.bus_bandwidth_bytes_per_s)
            return f"{_us(a.latency_s)} / {_us(a.latency_per_gpu_s)} / {bus}"

        lines.append(
            f"| {r['profile']} | {r['engine']} | {t.compute:.3f} | {t.memory:.3f} | "
            f"{t.ridge_sharpness:.2f} | {_us(t.kernel_floor_s)} | {t.attention:.3f} | "
            f"{t.attention_ramp_tokens:.0f} | {_us(t.attention_floor_s)} | "
            f"{t.decode_attention:.3f} | {_us(t.decode_attention_floor_s)} | "
            f"{t.decode_attention_per_sequence_s * 1e9:.3g}ns | {cell('custom')} | "
            f"{cell('nccl')} |"
        )
    lines.append("")
    for r in results:
        vers = ", ".join(f"{k} {v}" for k, v in r["versions"].items())
        lines += [
            f"**{r['profile']} × {r['engine']}**" + (f" ({vers})" if vers else ""),
            "",
            "| kernels | half | points | median | p90 | worst | bias | current median | "
            "current p90 | current worst | current bias | earlier form median | "
            "earlier form bias |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in r["rows"]:
            f, c, e = row["fitted"], row["current"], row["earlier"]
            cur = (
                f"{_pct(c['median_abs'])} | {_pct(c['p90_abs'])} | {_pct(c['worst_abs'])} | "
                f"{c['bias']:+.1%}"
                if c
                else "— | — | — | —"
            )
            old = f"{_pct(e['median_abs'])} | {e['bias']:+.1%}" if e else "— | —"
            lines.append(
                f"| {row['family']} | {row['half']} | {f['points']} | {_pct(f['median_abs'])} | "
                f"{_pct(f['p90_abs'])} | {_pct(f['worst_abs'])} | {f['bias']:+.1%} | {cur} | "
                f"{old} |"
            )
        lines.append("")
    return "\n".join(lines)


def update_doc(block: str, path: Path = DOC) -> None:
    """Replace the generated block of docs/validation.md (the markers must be there)."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: the markers {BEGIN!r} / {END!r} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n\n{block.strip()}\n\n{END}{tail}")


# --------------------------------------------------------------------------------------------
# hardware profiles


def _num(x: float) -> str:
    return f"{x:.4g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.3e}".replace("e-0", "e-")


def engine_toml(engine: str, t: Terms) -> str:
    """The [engines.E] table and its all-reduce list, as TOML text."""
    keys = [
        ("compute", t.compute),
        ("memory", t.memory),
        ("ridge_sharpness", t.ridge_sharpness),
        ("kernel_floor_s", t.kernel_floor_s),
        ("attention", t.attention),
        ("attention_ramp_tokens", t.attention_ramp_tokens),
        ("attention_floor_s", t.attention_floor_s),
        ("decode_attention", t.decode_attention),
        ("decode_attention_floor_s", t.decode_attention_floor_s),
        ("decode_attention_per_sequence_s", t.decode_attention_per_sequence_s),
    ]
    out = [f"[engines.{engine}]"] + [f"{k} = {_num(v)}" for k, v in keys]
    for a in t.allreduce:
        out += [
            "",
            f"[[engines.{engine}.allreduce]]",
            f'name = "{a.name}"',
            f'latency = "{_us(a.latency_s)}"',
            f'latency_per_gpu = "{_us(a.latency_per_gpu_s)}"',
            f'bus_bandwidth = "{_gbs(a.bus_bandwidth_bytes_per_s)}"',
        ]
        if a.max_bytes is not None:
            out.append(f'max_bytes = "{a.max_bytes / MIB:g}MiB"')
    return "\n".join(out)


def engine_sources(r: dict, doc_anchor: str) -> list[str]:
    """The [sources] lines of one [engines.E] table: what each term is and which table of the
    database it was fitted to."""
    e, t, vers = r["engine"], r["terms"], r["versions"]

    def measured(what: str, table: str) -> str:
        return (
            f"measured: {what}, fitted by benchmarks/fit_aiconfigurator.py to NVIDIA's "
            f"AIConfigurator kernel database (aiconfigurator-core 0.12.0, Apache-2.0; {r['gpu']} "
            f"{table} under {vers.get(table, e)}; CUDA-graph replay) on alternate shapes; "
            f"held-out error in {doc_anchor}"
        )

    what = {
        "compute": ("BF16 GEMM compute efficiency", "gemm"),
        "memory": ("BF16 GEMM memory efficiency (fitted, not held)", "gemm"),
        "ridge_sharpness": ("p-norm ridge of BF16 GEMMs", "gemm"),
        "kernel_floor_s": ("fixed cost per GEMM kernel", "gemm"),
        "attention": ("prefill attention FLOP efficiency of long chunks", "context attention"),
        "attention_ramp_tokens": (
            "chunk length at which prefill attention reaches half that efficiency",
            "context attention",
        ),
        "attention_floor_s": ("fixed cost per layer of prefill attention", "context attention"),
        "decode_attention": (
            "share of HBM bandwidth decode attention reaches",
            "generation attention",
        ),
        "decode_attention_floor_s": (
            "fixed cost per layer of decode attention",
            "generation attention",
        ),
        "decode_attention_per_sequence_s": (
            "cost per sequence per layer of decode attention",
            "generation attention",
        ),
    }
    lines = []
    for key, (text, table) in what.items():
        src = measured(text, table)
        if table == "generation attention" and not r["measured"]["decode"]:
            src = f"assumption: no {table} table for {e} on {r['gpu']}; GEMM memory terms"
        if table == "context attention" and not r["measured"]["prefill"]:
            src = f"assumption: no {table} table for {e} on {r['gpu']}; current [efficiency]"
        lines.append(f'"engines.{e}.{key}" = "{src}"')
    for a in t.allreduce:
        table = "all-reduce" if a.name == "custom" else "nccl"
        kind = "the engine's graph-mode all-reduce" if a.name == "custom" else "NCCL (nccl-tests)"
        for key in ("latency", "latency_per_gpu", "bus_bandwidth"):
            src = measured(f"{kind} {key.replace('_', ' ')}", table)
            lines.append(f'"engines.{e}.allreduce.{a.name}.{key}" = "{src}"')
        if a.max_bytes is not None:
            src = CUSTOM_MAX_SOURCE[e]
            lines.append(f'"engines.{e}.allreduce.{a.name}.max_bytes" = "{src}"')
    return lines


SOURCES_BEGIN = "# fit_aiconfigurator.py: engine sources below (generated)"
SOURCES_END = "# fit_aiconfigurator.py: engine sources above"


def _strip_block(text: str, begin: str, end: str) -> tuple[str, int | None]:
    """``text`` without the block from the line ``begin`` to the line ``end`` (and the blank
    line after it), and where it was (None: not there)."""
    i = text.find(begin + "\n")
    j = text.find(end + "\n", max(i, 0))
    if i < 0 or j < 0:
        return text, None
    j += len(end) + 1
    if text.startswith("\n", j):
        j += 1
    return text[:i] + text[j:], i


def with_engine_blocks(text: str, tables: str, sources: str, where: str = "") -> str:
    """A profile's text with its generated [engines.*] tables (where they were, else before the
    first ``[[tiers]]``) and their [sources] lines (at the end: [sources] must be the last
    table); every other line unchanged, so stripping both blocks gives the text back."""
    text, at = _strip_block(text, TOML_BEGIN, TOML_END)
    text, _ = _strip_block(text, SOURCES_BEGIN, SOURCES_END)
    last_table = max(text.rfind("\n["), 0)
    if not text[last_table:].lstrip("\n").startswith("[sources]"):
        raise SystemExit(f"{where}: [sources] is not the last table; cannot add engine sources")
    if at is None:
        at = text.find("\n[[tiers]]")
        at = len(text) if at < 0 else at + 1
    text = text[:at] + f"{TOML_BEGIN}\n{tables}\n{TOML_END}\n\n" + text[at:]
    if not text.endswith("\n"):
        text += "\n"
    return text + f"{SOURCES_BEGIN}\n{sources}\n{SOURCES_END}\n"


def write_profiles(results: list[dict], directory: Path = PROFILES_DIR) -> list[Path]:
    """Write each fitted profile's [engines.*] tables and their [sources] lines."""
    anchor = "docs/validation.md (Kernels: NVIDIA's AIConfigurator database)"
    written = []
    for name in sorted({r["profile"] for r in results}):
        path = directory / f"{name}.toml"
        mine = [r for r in results if r["profile"] == name]
        tables = "\n\n".join(engine_toml(r["engine"], r["terms"]) for r in mine)
        sources = "\n".join(line for r in mine for line in engine_sources(r, anchor))
        path.write_text(with_engine_blocks(path.read_text(), tables, sources, str(path)))
        written.append(path)
    return written


# --------------------------------------------------------------------------------------------


def run(root: Path, gpus: list[str] | None = None, engines: list[str] | None = None) -> list[dict]:
    db = open_db(root)
    results = []
    for gpu in gpus or [g for g in GPUS if g in set(db.gpus())]:
        if not (PROFILES_DIR / f"{GPUS[gpu]}.toml").exists():
            print(f"# {gpu}: no hardware_profiles/{GPUS[gpu]}.toml, skipped", file=sys.stderr)
            continue
        profile = load_profile(GPUS[gpu])
        for engine in engines or ENGINES:
            if engine not in set(db.engines(gpu)):
                continue
            r = fit_engine(db, gpu, engine, profile)
            if r is not None:
                results.append(r)
                print(f"# {gpu} x {engine}: fitted", file=sys.stderr)
    return results


def _jsonable(results: list[dict]) -> list[dict]:
    out = []
    for r in results:
        d = dict(r)
        d["terms"] = asdict(r["terms"])
        out.append(d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, help=f"the wheel's root (default ${ENV}, then {WHEEL})")
    ap.add_argument("--gpu", action="append", choices=sorted(GPUS), help="only these GPUs")
    ap.add_argument("--engine", action="append", choices=ENGINES, help="only these engines")
    ap.add_argument("--markdown", action="store_true", help="print the tables")
    ap.add_argument("--update-doc", action="store_true", help="rewrite docs/validation.md's block")
    ap.add_argument("--write-profiles", action="store_true", help="write [engines.*] tables")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    root, source = data_root(args.data)
    source += f" (aiconfigurator-core {open_db(root).wheel_version})"
    print(f"# data: {source}", file=sys.stderr)
    results = run(root, args.gpu, args.engine)
    block = markdown(results, source)
    if args.json:
        args.json.write_text(json.dumps(_jsonable(results), indent=1, default=str))
    if args.markdown:
        print(block)
    else:
        for r in results:
            print(
                json.dumps({k: r[k] for k in ("gpu", "engine")} | asdict(r["terms"]), default=str)
            )
    if args.update_doc:
        update_doc(block)
    if args.write_profiles:
        for path in write_profiles(results):
            print(f"# wrote {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Run a calibration: microbenchmarks, measured tables, fitted overhead, held-out validation.

The sweep grids are interleaved: the *fit* points go into the profile, the *held-out* points
(geometric midpoints between them) are measured too but only used to check the interpolation.
The per-iteration overhead is fitted from forward passes on two small batches; the validation
batches are others.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
import os
import platform
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from kvsim.calibrate import bench
from kvsim.calibrate.decoder import Batch, RandomDecoder
from kvsim.calibrate.ops import TORCH_DTYPES, LayerWeights, attn_shape
from kvsim.calibrate.write import cpu_profile, gpu_profile
from kvsim.errors import ConfigError
from kvsim.hardware.measured import (
    FORMAT,
    MeasuredCostModel,
    TransferModel,
    gemm_shapes,
    make_cost_model,
    parse_measured,
    supported,
)
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec

MiB = 1 << 20


@dataclass(frozen=True)
class Plan:
    """What to measure: fit grids, held-out points, transfer sizes and forward-pass batches."""

    tokens: list[int]
    tokens_held: list[int]
    prefill: list[int]
    prefill_held: list[int]
    cached_ratio: int  # cached prefix = ratio x new tokens
    decode_batch: list[int]
    decode_context: list[int]
    decode_held: list[tuple[int, int]]
    copy_bytes: list[int]
    storage_bytes: list[int]
    storage_file_bytes: int
    fit_batches: list[Batch]
    batches: list[Batch]
    warmup: int = 2
    reps: int = 5
    target_s: float = 1e-3


def _mid(values: list[int]) -> list[int]:
    return [round(math.sqrt(a * b)) for a, b in itertools.pairwise(values)]


def make_plan(device: str, quick: bool) -> Plan:
    """Grids sized so ``--quick`` finishes in seconds on a CPU (tiny model) and in under five
    minutes on a GPU; the full plan sweeps further."""
    cuda = device == "cuda"
    if cuda:
        tokens = [1, 4, 16, 64, 256, 1024, 4096] + ([] if quick else [8192, 16384])
        prefill = [64, 256, 1024, 4096] + ([] if quick else [8192, 16384])
        batch = [1, 4, 16, 64, 256]
        context = [128, 512, 2048, 8192] + ([] if quick else [32768])
        copy = [4096 * 4**i for i in range(10 if quick else 12)]
        storage = [MiB, 4 * MiB, 16 * MiB, 64 * MiB]
        fit = [Batch("fit-prefill", ((64, 0),)), Batch("fit-decode", (), 1, 128)]
        batches = [
            Batch("prefill 1x2048", ((2048, 0),), kind="prefill-only"),
            Batch("prefill 3 prompts", ((512, 0), (1024, 0), (300, 0)), kind="prefill-only"),
            Batch("prefill after prefix", ((512, 1536),), kind="prefill-only"),
            Batch("decode 32x1000", (), 32, 1000, kind="decode-only"),
            Batch("decode 128x3000", (), 128, 3000, kind="decode-only"),
            Batch("decode 8x6000", (), 8, 6000, kind="decode-only"),
            Batch("mixed 512 + 64x1500", ((512, 0),), 64, 1500, kind="mixed"),
            Batch("mixed 256+768 + 24x4000", ((256, 768),), 24, 4000, kind="mixed"),
        ]
        return Plan(
            tokens,
            _mid(tokens),
            prefill,
            _mid(prefill),
            3,
            batch,
            context,
            [(2, 256), (8, 1024), (32, 4096), (128, 1000)],
            copy,
            storage,
            256 * MiB,
            fit,
            batches,
            warmup=3,
            reps=7 if quick else 15,
            target_s=2e-3,
        )
    tokens = [1, 4, 16, 64, 256] + ([] if quick else [1024, 4096])
    prefill = [16, 64, 256] + ([] if quick else [1024])
    batch = [1, 4, 16] + ([] if quick else [64])
    context = [64, 256, 1024] + ([] if quick else [4096])
    copy = [64 * 1024 * 4**i for i in range(5 if quick else 7)]
    storage = [MiB, 4 * MiB] + ([] if quick else [16 * MiB])
    fit = [Batch("fit-prefill", ((16, 0),)), Batch("fit-decode", (), 1, 64)]
    batches = [
        Batch("prefill 1x200", ((200, 0),), kind="prefill-only"),
        Batch("prefill 3 prompts", ((64, 0), (100, 0), (30, 0)), kind="prefill-only"),
        Batch("prefill after prefix", ((48, 144),), kind="prefill-only"),
        Batch("decode 8x300", (), 8, 300, kind="decode-only"),
        Batch("decode 12x700", (), 12, 700, kind="decode-only"),
        Batch("mixed 64 + 8x200", ((64, 0),), 8, 200, kind="mixed"),
        Batch("mixed 32+96 + 6x500", ((32, 96),), 6, 500, kind="mixed"),
    ]
    return Plan(
        tokens,
        _mid(tokens),
        prefill,
        _mid(prefill),
        3,
        batch,
        context,
        [(2, 128), (8, 512)],
        copy,
        storage,
        16 * MiB if quick else 64 * MiB,
        fit,
        batches,
        warmup=1 if quick else 2,
        reps=5,
        target_s=5e-4 if quick else 2e-3,
    )


@dataclass
class Calibration:
    """What a run produced: the ``[measured]`` tables, held-out and forward-pass checks."""

    measured: dict[str, Any]
    profile: HardwareProfile
    held_out: dict[str, list[tuple[str, float, float]]]  # family -> (label, measured, predicted)
    forward: list[dict[str, Any]]
    storage_note: str
    notes: list[str] = field(default_factory=list)

    def held_out_errors(self) -> dict[str, tuple[float, float]]:
        """Family -> (median, worst) absolute relative error on held-out shapes."""
        out = {}
        for family, rows in self.held_out.items():
            errors = [abs(p - m) / m for _, m, p in rows]
            if errors:
                out[family] = (statistics.median(errors), max(errors))
        return out

    def forward_errors(self) -> tuple[float, float] | None:
        """(median, worst) absolute relative error of the predicted iteration times."""
        errors = [abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in self.forward]
        return (statistics.median(errors), max(errors)) if errors else None


def device_info(device: torch.device) -> dict[str, str]:
    """Name, driver and versions to stamp on the measured tables."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        driver = "unknown"
        try:
            import subprocess

            driver = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
        driver = f"{driver} (CUDA {torch.version.cuda})"
    else:
        name = (
            f"CPU {platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"
        )
        driver = f"{platform.system()} {platform.release()}"
    return {"device": name, "driver": driver, "torch": torch.__version__}


def calibrate(
    model: ModelSpec,
    base: HardwareProfile | None,
    *,
    name: str = "calibrated",
    device: str = "cpu",
    tp: int = 1,
    quick: bool = False,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    storage_dir: str | None = None,
    threads: int | None = None,
    log: Any = None,
) -> Calibration:
    """Measure every kernel family for ``model`` on ``device`` and check the fit.

    ``base`` (a shipped GPU profile) supplies the roofline that extrapolation relaxes to; with
    None (a CPU run) the best measured rates stand in for the peaks. ``threads`` sets torch's
    CPU threads for the run (default on a CPU: 1, which a busy machine cannot stall the way it
    stalls a spin-waiting thread pool).
    """
    saved = torch.get_num_threads()
    if threads is None and device == "cpu":
        threads = 1
    if threads:
        torch.set_num_threads(threads)
    try:
        return _calibrate(model, base, name, device, tp, quick, dtype, kv_dtype, storage_dir, log)
    finally:
        torch.set_num_threads(saved)


def _calibrate(model, base, name, device, tp, quick, dtype, kv_dtype, storage_dir, log):
    """``calibrate`` once torch's thread count is set."""
    say = log or (lambda _msg: None)
    reason = supported(model)
    if reason:
        raise ConfigError(f"kvsim calibrate supports dense full/sliding/MLA models; {reason}")
    if dtype not in TORCH_DTYPES:
        raise ConfigError(f"--dtype: expected one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    if kv_dtype != dtype:
        raise ConfigError(f"--kv-dtype: calibration measures KV in {dtype}, got {kv_dtype!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: PyTorch sees no CUDA device here; use --device cpu")
    dev = torch.device(device)
    tdtype = TORCH_DTYPES[dtype]
    plan = make_plan(device, quick)
    timer = bench.Timer(dev, plan.warmup, plan.reps, plan.target_s)
    shape = attn_shape(model, tp)
    torch.manual_seed(0)
    with torch.inference_mode():
        say("GEMMs")
        gemm: dict[str, Any] = {}
        held: dict[str, list[tuple[str, float, float]]] = {"gemm": []}
        held_gemm: dict[str, list[tuple[int, float]]] = {}
        for gname, s in gemm_shapes(model, tp).items():
            fit = [bench.time_gemm(timer, s, m, tdtype, dev) for m in plan.tokens]
            gemm[gname] = {
                "k": s.k,
                "n": s.n,
                "calls": s.calls,
                "per": s.per,
                "tokens": plan.tokens,
                "seconds": [t.seconds for t in fit],
                "spread": [t.spread for t in fit],
            }
            held_gemm[gname] = [
                (m, bench.time_gemm(timer, s, m, tdtype, dev).seconds) for m in plan.tokens_held
            ]
        say("elementwise")
        weights = LayerWeights(model, shape, tp, tdtype, dev)
        ew = [
            bench.time_elementwise(timer, weights, shape, model.hidden_size, m, tdtype, dev)
            for m in plan.tokens
        ]
        ew_held = [
            (m, bench.time_elementwise(timer, weights, shape, model.hidden_size, m, tdtype, dev))
            for m in plan.tokens_held
        ]
        say("prefill attention")
        pre = [bench.time_prefill(timer, shape, n, 0, tdtype, dev) for n in plan.prefill]
        pre_c = [
            bench.time_prefill(timer, shape, n, plan.cached_ratio * n, tdtype, dev)
            for n in plan.prefill
        ]
        pre_held = [
            (n, bench.time_prefill(timer, shape, n, 0, tdtype, dev)) for n in plan.prefill_held
        ]
        pre_c_held = [
            (n, bench.time_prefill(timer, shape, n, plan.cached_ratio * n, tdtype, dev))
            for n in plan.prefill_held
        ]
        say("decode attention")
        dec = [
            [
                bench.time_decode(timer, shape, b, c, tdtype, dev).seconds
                for c in plan.decode_context
            ]
            for b in plan.decode_batch
        ]
        dec_held = [
            (b, c, bench.time_decode(timer, shape, b, c, tdtype, dev).seconds)
            for b, c in plan.decode_held
        ]
        say("host<->device copies")
        copies = {}
        copy_held: dict[str, list[tuple[int, float]]] = {}
        for direction in ("h2d", "d2h"):
            fit = [bench.time_copy(timer, b, direction, dev) for b in plan.copy_bytes]
            copies[direction] = {
                "pinned": dev.type == "cuda",
                "bytes": plan.copy_bytes,
                "seconds": [t.seconds for t in fit],
                "spread": [t.spread for t in fit],
            }
            copy_held[direction] = [
                (b, bench.time_copy(timer, b, direction, dev).seconds)
                for b in _mid(plan.copy_bytes)
            ]
    say("storage reads")
    storage = bench.time_storage(
        plan.storage_bytes, plan.storage_file_bytes, storage_dir, dev, max(3, plan.reps // 2)
    )
    info = device_info(dev)
    measured: dict[str, Any] = {
        "format": FORMAT,
        **info,
        "device_kind": device,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": model.name,
        "tp": tp,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "quick": quick,
        "repetitions": plan.reps,
        "warmup": plan.warmup,
        "threads": torch.get_num_threads(),
        "overhead_s": 0.0,
        "gemm": gemm,
        "elementwise": {
            "tokens": plan.tokens,
            "seconds": [t.seconds for t in ew],
            "spread": [t.spread for t in ew],
        },
        "prefill_attention": _prefill_doc(plan.prefill, 0, pre),
        "prefill_attention_cached": _prefill_doc(plan.prefill, plan.cached_ratio, pre_c),
        "decode_attention": {
            "batch": plan.decode_batch,
            "context": plan.decode_context,
            "seconds": dec,
        },
        "copy": copies,
        "storage": {
            "path": storage.path,
            "method": storage.method,
            "bytes": storage.sizes,
            "seconds": [t.seconds for t in storage.timings],
            "spread": [t.spread for t in storage.timings],
        },
    }
    profile = _profile(name, base, measured, storage_dir)
    cost = _cost_model(model, profile, measured, tp, dtype, kv_dtype)

    # held-out shapes, predicted by the interpolation of the fit points
    curves = {g: c for (_, _, c), g in zip(cost.gemm, gemm, strict=True)}
    for gname, rows in held_gemm.items():
        held["gemm"] += [(f"{gname} M={m}", t, float(curves[gname](m))) for m, t in rows]
    held["elementwise"] = [(f"T={m}", t.seconds, float(cost.elementwise(m))) for m, t in ew_held]
    held["prefill attention"] = [
        (f"new={n}", t.seconds, float(cost.prefill(_pairs(n, 0)))) for n, t in pre_held
    ]
    held["prefill attention (cached prefix)"] = [
        (
            f"new={n} ctx={plan.cached_ratio * n}",
            t.seconds,
            float(cost.prefill_cached(_pairs(n, plan.cached_ratio * n))),
        )
        for n, t in pre_c_held
    ]
    held["decode attention"] = [
        (f"B={b} C={c}", t, float(cost.decode(b, c))) for b, c, t in dec_held
    ]
    transfer = TransferModel(profile)
    for direction, rows in copy_held.items():
        held[f"copy {direction}"] = [
            (f"{b} B", t, transfer.time_s("dram", b, write=direction == "d2h")) for b, t in rows
        ]

    # end to end: fit the fixed overhead on two batches, validate on the others
    forward: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        say("forward passes")
        decoder = RandomDecoder(model, tp, tdtype, dev)
        fit_times = [_time_forward(decoder, b, timer) for b in plan.fit_batches]
        residuals = [
            t - cost.iteration_time_s(list(b.prefill), b.decode_contexts)
            for b, t in zip(plan.fit_batches, fit_times, strict=True)
        ]
        measured["overhead_s"] = max(0.0, statistics.median(residuals))
        profile = _profile(name, base, measured, storage_dir)
        cost = _cost_model(model, profile, measured, tp, dtype, kv_dtype)
        roofline = make_cost_model(
            model,
            dataclasses.replace(profile, measured={}),
            tp=tp,
            kv_dtype=kv_dtype,
            weight_dtype=dtype,
        )
        for b in plan.batches:
            t = _time_forward(decoder, b, timer)
            forward.append(
                {
                    "name": b.name,
                    "kind": b.kind,
                    "batch": b.label,
                    "tokens": b.tokens,
                    "measured_s": t,
                    "predicted_s": cost.iteration_time_s(list(b.prefill), b.decode_contexts),
                    "roofline_s": roofline.iteration_time_s(list(b.prefill), b.decode_contexts),
                }
            )
        del decoder
    except ConfigError as exc:
        notes.append(f"no end-to-end check: {exc}")
    storage_note = f"{storage.path} path, {storage.method} reads from a file in {storage.directory}"
    calib = Calibration(measured, profile, held, forward, storage_note, notes)
    measured["validation"] = _validation_doc(calib)
    return calib


def _profile(name, base, measured, storage_dir) -> HardwareProfile:
    if base is None:
        return cpu_profile(name, measured, storage_dir)
    return gpu_profile(name, base, measured)


def _pairs(new: int, context: int) -> float:
    return new * context + new * (new + 1) / 2


def _prefill_doc(news: list[int], ratio: int, timings: list[bench.Timing]) -> dict[str, Any]:
    return {
        "tokens": news,
        "context": [ratio * n for n in news],
        "seconds": [t.seconds for t in timings],
        "spread": [t.spread for t in timings],
    }


def _cost_model(model, profile, measured, tp, dtype, kv_dtype) -> MeasuredCostModel:
    def fail(field: str, message: str):
        raise AssertionError(f"calibration wrote a bad table: {field}: {message}")

    tables = parse_measured(measured, fail)
    return MeasuredCostModel(
        model, profile, tp=tp, kv_dtype=kv_dtype, weight_dtype=dtype, tables=tables
    )


def _time_forward(decoder: RandomDecoder, batch: Batch, timer: bench.Timer) -> float:
    state = decoder.prepare(batch)
    return timer(lambda: decoder.forward(batch, state)).seconds


def _validation_doc(c: Calibration) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for family, (median, worst) in c.held_out_errors().items():
        key = family.replace(" ", "_").replace("(", "").replace(")", "")
        doc[f"{key}_median_error"] = round(median, 4)
        doc[f"{key}_worst_error"] = round(worst, 4)
    errors = c.forward_errors()
    if errors:
        doc["forward_median_error"] = round(errors[0], 4)
        doc["forward_worst_error"] = round(errors[1], 4)
    return doc


def cpu_count() -> int:
    """Cores this process may use (for the report)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

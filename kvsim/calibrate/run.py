"""Run a calibration: microbenchmarks, measured tables, fitted overhead, held-out validation.

The sweep grids are interleaved: the *fit* points go into the profile, the *held-out* points
(geometric midpoints between them) are measured too but only used to check the interpolation.
The per-iteration overhead is the median residual of forward passes on four small batches; the
validation batches are of other compositions and never used for fitting. Every point (kernels,
held-out shapes, forward passes) is timed in the same interleaved rounds, so a shared machine's
slow phases fall on all of them alike.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import os
import platform
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from kvsim.calibrate import bench
from kvsim.calibrate.decoder import RandomDecoder
from kvsim.calibrate.ops import TORCH_DTYPES, LayerWeights, attn_shape
from kvsim.calibrate.plan import (
    LAYER_ROLES,
    Batch,
    Budget,
    Plan,
    ShapePlan,
    budget_for,
    make_plan,
    midpoints,
    plan_calibration,
)
from kvsim.calibrate.write import cpu_profile, gpu_profile
from kvsim.costmodel import MeasuredCostModel, TransferModel, make_cost_model
from kvsim.costmodel.shapes import gemm_shapes, supported
from kvsim.errors import ConfigError
from kvsim.hardware.measured_tables import FORMAT, parse_measured
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec, check_tp

__all__ = ["Calibration", "Plan", "calibrate", "make_plan", "scale_tables"]


@dataclass
class Calibration:
    """What a run produced: the ``[measured]`` tables, held-out and forward-pass checks."""

    measured: dict[str, Any]
    profile: HardwareProfile
    held_out: dict[str, list[tuple[str, float, float]]]  # family -> (label, measured, predicted)
    forward: list[dict[str, Any]]
    storage_note: str
    notes: list[str] = field(default_factory=list)
    shapes: str = ""  # what was timed (``ShapePlan.describe``)

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
    progress: bench.Progress | None = None,
    budget: Budget | None = None,
    sweep: Plan | None = None,
) -> Calibration:
    """Measure every kernel family for ``model`` on ``device`` and check the fit.

    ``base`` (a shipped GPU profile) supplies the roofline that extrapolation relaxes to; with
    None (a CPU run) the best measured rates stand in for the peaks. ``threads`` sets torch's
    CPU threads for the run (default on a CPU: 1, which a busy machine cannot stall the way it
    stalls a spin-waiting thread pool). ``log(message)`` hears each phase; ``progress(done,
    total, seconds_left)`` each timed point (``bench.measure``). ``budget`` bounds the timed
    shapes (default ``plan.budget_for``: on a CPU with ``quick``, layers of at most 48 MiB,
    scaled back to the model's; see ``kvsim.calibrate.plan``); ``sweep`` the sizes (default
    ``make_plan``).
    """
    saved = torch.get_num_threads()
    if threads is None and device == "cpu":
        threads = 1
    if threads:
        torch.set_num_threads(threads)
    try:
        run = (model, base, name, device, tp, quick, dtype, kv_dtype, storage_dir)
        return _calibrate(*run, log=log, progress=progress, budget=budget, sweep=sweep)
    finally:
        torch.set_num_threads(saved)


def _calibrate(model, base, name, device, tp, quick, dtype, kv_dtype, storage_dir, **hooks):
    """``calibrate`` once torch's thread count is set; ``hooks``: log, progress, budget, sweep."""
    say = hooks["log"] or (lambda _msg: None)
    progress, budget, sweep = hooks["progress"], hooks["budget"], hooks["sweep"]
    reason = supported(model)
    if reason:
        raise ConfigError(f"kvsim calibrate supports dense full/sliding/MLA models; {reason}")
    check_tp(model, tp)
    if dtype not in TORCH_DTYPES:
        raise ConfigError(f"--dtype: expected one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    if kv_dtype != dtype:
        raise ConfigError(f"--kv-dtype: calibration measures KV in {dtype}, got {kv_dtype!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: PyTorch sees no CUDA device here; use --device cpu")
    dev = torch.device(device)
    tdtype = TORCH_DTYPES[dtype]
    llc = bench.last_level_cache_bytes(dev)
    budget = budget or budget_for(device, quick, bench.device_memory_bytes(dev))
    plan, shaped = plan_calibration(  # MHA models: decode contexts shortened to fit the budget
        model, tp, tdtype.itemsize, budget, llc, sweep or make_plan(device, quick), device
    )
    spec = shaped.spec  # what is timed: one rank's shapes (or a proxy), at tp=1
    shapes = gemm_shapes(spec, 1)
    scrub = shaped.scrub_bytes  # as large as the model's weights (not the proxy's) or 2 x LLC
    timer = bench.Timer(dev, plan.warmup, plan.reps, plan.target_s, scrub_bytes=scrub)
    copy_timer = bench.Timer(dev, plan.warmup, plan.reps * plan.rounds, plan.target_s)
    shape = attn_shape(spec, 1)
    torch.manual_seed(0)
    notes: list[str] = []
    say(f"shapes: {shaped.describe()}")
    with torch.inference_mode():
        say("building probes")
        probes = _Probes()
        decoder = None
        try:
            decoder = RandomDecoder(spec, 1, tdtype, dev, layers=shaped.layers)
        except ConfigError as exc:
            notes.append(f"no end-to-end check: {exc}")
        layer_roles = set(_LAYER_ROLES) & set(shapes) if decoder is not None else set()
        if decoder is not None and layer_roles == set(_LAYER_ROLES):
            _layer_probes(probes, plan, decoder, shaped.copies, dev)
        else:
            layer_roles = set()
            _kernel_probes(probes, plan, spec, tdtype, dev, shape, timer)
        for gname, g in shapes.items():  # the LM head, and every GEMM a layer did not time
            if gname in layer_roles:
                continue
            if gname == "lm_head" and decoder is not None:
                w, bias = decoder.lm_head, None  # (vocab, hidden): the same matrix, not a copy
            else:
                w = bench.randn((g.n, g.k), tdtype, dev)
                bias = bench.randn((g.n,), tdtype, dev) if g.bias else None
            for part, rows in (("fit", plan.tokens), ("held", plan.tokens_held)):
                for m in rows:
                    probes.add(
                        lambda g=g, m=m, w=w, bias=bias: bench.pieces_sampler(
                            timer, bench.gemm_pieces(g, m, w, bias, tdtype, dev)
                        ),
                        {("gemm", gname, part, m): None},
                    )
        if decoder is not None:
            plain = bench.Timer(dev, plan.warmup, plan.reps, plan.target_s)
            for part, batches in (("fit", plan.fit_batches), ("check", plan.batches)):
                for i, b in enumerate(batches):
                    probes.add(  # a GPU's large batches' KV caches are rebuilt each round
                        _forward_build(decoder, b, plain),
                        {("forward", part, i): None},
                        keep=dev.type == "cpu",
                    )
        how = "single layers in context" if layer_roles else "kernels after a cache scrub"
        say(
            f"timing {len(probes.probes)} points ({how}"
            f"{', forward passes' if decoder else ''}) in {plan.rounds} interleaved rounds"
        )
        t = probes.run(plan, progress)
        del decoder, probes  # the probes' tensors (a GPU's KV caches) go now

        gemm: dict[str, Any] = {}
        for gname, g in shapes.items():
            fit = [t[("gemm", gname, "fit", m)] for m in plan.tokens]
            gemm[gname] = {
                "k": g.k,
                "n": g.n,
                "calls": g.calls,
                "per": g.per,
                "tokens": plan.tokens,
                "seconds": [x.seconds for x in fit],
                "spread": [x.spread for x in fit],
            }
        ew = [t[("elementwise", "fit", m)] for m in plan.tokens]
        pre = [t[("prefill", 0, "fit", n)] for n in plan.prefill]
        pre_c = [t[("prefill", plan.cached_ratio, "fit", n)] for n in plan.prefill]
        dec = [
            [t[("decode", "fit", b, c)].seconds for c in plan.decode_context]
            for b in plan.decode_batch
        ]
        say("host<->device copies")
        copies = {}
        copy_held: dict[str, list[tuple[int, float]]] = {}
        for direction in ("h2d", "d2h"):
            fit = [bench.time_copy(copy_timer, b, direction, dev) for b in plan.copy_bytes]
            copies[direction] = {
                "pinned": dev.type == "cuda",
                "bytes": plan.copy_bytes,
                "seconds": [x.seconds for x in fit],
                "spread": [x.spread for x in fit],
            }
            copy_held[direction] = [
                (b, bench.time_copy(copy_timer, b, direction, dev).seconds)
                for b in midpoints(plan.copy_bytes)
            ]
    say("storage reads")
    storage = bench.time_storage(
        plan.storage_bytes, plan.storage_file_bytes, storage_dir, dev, max(3, plan.reps)
    )
    info = device_info(dev)
    timed: dict[str, Any] = {  # the tables of the timed shapes; scaled to the model's below
        "format": FORMAT,
        **info,
        "device_kind": device,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": spec.name,
        "tp": 1,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "quick": quick,
        "repetitions": plan.reps * plan.rounds,
        "rounds": plan.rounds,
        "warmup": plan.warmup,
        "threads": torch.get_num_threads(),
        "scrub_bytes": scrub,
        "overhead_s": 0.0,
        "gemm": gemm,
        "elementwise": {
            "tokens": plan.tokens,
            "seconds": [x.seconds for x in ew],
            "spread": [x.spread for x in ew],
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
            "seconds": [x.seconds for x in storage.timings],
            "spread": [x.spread for x in storage.timings],
        },
    }
    profile = _profile(name, base, timed, storage_dir)
    cost = _cost_model(spec, profile, timed, 1, dtype, kv_dtype)

    # held-out shapes, predicted by the interpolation of the fit points only
    held: dict[str, list[tuple[str, float, float]]] = {"gemm": []}
    curves = {g: c for (_, _, c), g in zip(cost.gemm, gemm, strict=True)}
    for gname in gemm:
        held["gemm"] += [
            (f"{gname} M={m}", t[("gemm", gname, "held", m)].seconds, float(curves[gname](m)))
            for m in plan.tokens_held
        ]
    held["elementwise"] = [
        (f"T={m}", t[("elementwise", "held", m)].seconds, float(cost.elementwise(m)))
        for m in plan.tokens_held
    ]
    held["prefill attention"] = [
        (f"new={n}", t[("prefill", 0, "held", n)].seconds, float(cost.prefill(_pairs(n, 0))))
        for n in plan.prefill_held
    ]
    r = plan.cached_ratio
    held["prefill attention (cached prefix)"] = [
        (
            f"new={n} ctx={r * n}",
            t[("prefill", r, "held", n)].seconds,
            float(cost.prefill_cached(_pairs(n, r * n))),
        )
        for n in plan.prefill_held
    ]
    held["decode attention"] = [
        (f"B={b} C={c}", t[("decode", "held", b, c)].seconds, float(cost.decode(b, c)))
        for b, c in plan.decode_held
    ]
    transfer = TransferModel(profile)
    for direction, rows in copy_held.items():
        held[f"copy {direction}"] = [
            (f"{b} B", x, transfer.time_s("dram", b, write=direction == "d2h")) for b, x in rows
        ]

    # end to end: the fixed overhead comes from the fit batches only; the check batches, of
    # other compositions, are never used for fitting
    forward: list[dict[str, Any]] = []
    if ("forward", "fit", 0) in t:
        residuals = [
            t[("forward", "fit", i)].seconds
            - cost.iteration_time_s(list(b.prefill), b.decode_contexts)
            for i, b in enumerate(plan.fit_batches)
        ]
        timed["overhead_s"] = max(0.0, statistics.median(residuals))
        profile = _profile(name, base, timed, storage_dir)
        cost = _cost_model(spec, profile, timed, 1, dtype, kv_dtype)
        roofline = make_cost_model(
            spec,
            dataclasses.replace(profile, measured={}),
            tp=1,
            kv_dtype=kv_dtype,
            weight_dtype=dtype,
        )
        for i, b in enumerate(plan.batches):
            forward.append(
                {
                    "name": b.name,
                    "kind": b.kind,
                    "batch": b.label,
                    "tokens": b.tokens,
                    "layers": shaped.layers,
                    "measured_s": t[("forward", "check", i)].seconds,
                    "spread": t[("forward", "check", i)].spread,
                    "predicted_s": cost.iteration_time_s(list(b.prefill), b.decode_contexts),
                    "roofline_s": roofline.iteration_time_s(list(b.prefill), b.decode_contexts),
                }
            )
    measured = scale_tables(timed, shaped)
    profile = _profile(name, base, measured, storage_dir)
    _cost_model(model, profile, measured, tp, dtype, kv_dtype)  # the model's tables price it
    held = {family: _scale_held(family, rows, shaped) for family, rows in held.items()}
    storage_note = f"{storage.path} path, {storage.method} reads from a file in {storage.directory}"
    calib = Calibration(measured, profile, held, forward, storage_note, notes, shaped.describe())
    measured["validation"] = _validation_doc(calib, shaped)
    return calib


def scale_tables(timed: dict[str, Any], shaped: ShapePlan) -> dict[str, Any]:
    """The ``[measured]`` tables of ``shaped.model`` at ``shaped.tp`` from those of the timed
    shapes: each GEMM at the model's ``k``, ``n`` and calls with its seconds times its scale,
    attention and elementwise times by theirs (``kvsim.calibrate.plan``). A scaled table
    keeps its factor as ``scale`` (and a GEMM its timed ``timed_k`` / ``timed_n``), which the
    cost model ignores. Copies, storage and the fixed overhead do not depend on the shapes."""
    out = copy.deepcopy(timed)
    out["model"], out["tp"] = shaped.model.name, shaped.tp
    real = gemm_shapes(shaped.model, shaped.tp)
    gemm = {}
    for role, doc in timed["gemm"].items():
        g, s = real[role], shaped.gemm_scale[role]
        entry = {**doc, "k": g.k, "n": g.n, "calls": g.calls, "per": g.per}
        if s != 1.0:
            entry["seconds"] = [x * s for x in doc["seconds"]]
            entry |= {"timed_k": doc["k"], "timed_n": doc["n"], "scale": s}
        gemm[role] = entry
    out["gemm"] = gemm
    for key, s in (
        ("elementwise", shaped.elementwise_scale),
        ("prefill_attention", shaped.attention_scale),
        ("prefill_attention_cached", shaped.attention_scale),
    ):
        if s != 1.0 and key in out:
            out[key]["seconds"] = [x * s for x in out[key]["seconds"]]
            out[key]["scale"] = s
    s = shaped.attention_scale
    if s != 1.0:
        d = out["decode_attention"]
        d["seconds"] = [[x * s for x in row] for row in d["seconds"]]
        d["scale"] = s
    return out


def _scale_held(
    family: str, rows: list[tuple[str, float, float]], shaped: ShapePlan
) -> list[tuple[str, float, float]]:
    """Held-out (label, measured, predicted) rows at the model's shapes, as the tables are."""
    if family == "gemm":
        scales = [shaped.gemm_scale[label.split()[0]] for label, _, _ in rows]
    elif family == "elementwise":
        scales = [shaped.elementwise_scale] * len(rows)
    elif "attention" in family:
        scales = [shaped.attention_scale] * len(rows)
    else:  # copies
        return rows
    return [(lbl, m * s, p * s) for (lbl, m, p), s in zip(rows, scales, strict=True)]


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


_LAYER_ROLES = LAYER_ROLES


def _layer_probes(probes, plan: Plan, decoder: RandomDecoder, copies: int, dev) -> None:
    """GEMMs, elementwise work and attention timed inside single decoder layers (cycling the
    decoder's first ``copies`` layers): one probe per batch shape, each giving every part it
    runs (token sweeps run as one prompt, no prefix)."""
    outputs: dict[Batch, dict[tuple, str | None]] = {}

    def want(batch: Batch, key: tuple, part: str) -> None:
        outputs.setdefault(batch, {})[key] = part

    for part, rows in (("fit", plan.tokens), ("held", plan.tokens_held)):
        for m in rows:
            batch = Batch("layer", ((m, 0),))
            for role in _LAYER_ROLES:
                want(batch, ("gemm", role, part, m), role)
            want(batch, ("elementwise", part, m), "elementwise")
    for ratio in (0, plan.cached_ratio):
        for part, news in (("fit", plan.prefill), ("held", plan.prefill_held)):
            for n in news:
                want(Batch("layer", ((n, ratio * n),)), ("prefill", ratio, part, n), "attention")
    grid = [(b, c) for b in plan.decode_batch for c in plan.decode_context]
    for part, points in (("fit", grid), ("held", plan.decode_held)):
        for b, c in points:
            want(Batch("layer", (), b, c), ("decode", part, b, c), "attention")
    s = decoder.shape
    kv_per_token = copies * s.kv_heads * (s.head_dim + s.v_dim) * decoder.dtype.itemsize
    for batch, keys in outputs.items():
        probes.add(  # KV caches over 1 GiB are rebuilt each round, so an 80 GB GPU holds them
            lambda batch=batch: bench.layer_sampler(decoder, batch, dev, copies),
            keys,
            keep=batch.cached * kv_per_token <= 1 << 30,
        )


def _kernel_probes(probes, plan, spec: ModelSpec, tdtype, dev, shape, timer) -> None:
    """Elementwise work and attention, each alone after a cache scrub, for models the decoder
    cannot run (MLA); the caller adds every GEMM role the same way."""
    weights = LayerWeights(spec, shape, 1, tdtype, dev)
    for part, rows in (("fit", plan.tokens), ("held", plan.tokens_held)):
        for m in rows:
            probes.add(
                lambda m=m: bench.pieces_sampler(
                    timer,
                    bench.elementwise_probe_pieces(
                        weights, shape, spec.hidden_size, m, tdtype, dev
                    ),
                ),
                {("elementwise", part, m): None},
            )
    for ratio in (0, plan.cached_ratio):
        for part, news in (("fit", plan.prefill), ("held", plan.prefill_held)):
            for n in news:
                probes.add(
                    lambda n=n, c=ratio * n: bench.pieces_sampler(
                        timer, bench.prefill_pieces(shape, n, c, tdtype, dev)
                    ),
                    {("prefill", ratio, part, n): None},
                )
    grid = [(b, c) for b in plan.decode_batch for c in plan.decode_context]
    for part, points in (("fit", grid), ("held", plan.decode_held)):
        for b, c in points:
            probes.add(
                lambda b=b, c=c: bench.pieces_sampler(
                    timer, bench.decode_pieces(shape, b, c, tdtype, dev)
                ),
                {("decode", part, b, c): None},
            )


def _forward_build(decoder: RandomDecoder, batch: Batch, timer: bench.Timer):
    """A probe builder for one forward pass of ``batch`` (its KV caches filled); passes run
    back to back as a server's iterations do (no scrub)."""

    def build():
        state = decoder.prepare(batch)
        return lambda: {"forward": timer.once(lambda: decoder.forward(batch, state))}

    return build


class _Probes:
    """Measurement points, each giving one or more keyed results (a part's median, or the sum
    of all parts' medians for ``None``), timed together by ``bench.measure``."""

    def __init__(self) -> None:
        self.probes: list[bench.Probe] = []
        self.outputs: list[dict[tuple, str | None]] = []

    def add(
        self, build, outputs: dict[tuple, str | None], keep: bool = True, settle: int = 1
    ) -> None:
        self.probes.append(bench.Probe(build, keep, settle))
        self.outputs.append(outputs)

    def run(self, plan: Plan, progress: bench.Progress | None = None) -> dict[tuple, bench.Timing]:
        results = bench.measure(
            self.probes, plan.rounds, plan.reps, plan.warmup, plan.target_s, progress
        )
        out = {}
        for parts, outputs in zip(results, self.outputs, strict=True):
            for key, part in outputs.items():
                out[key] = bench.total(parts) if part is None else parts[part]
        return out


def _validation_doc(c: Calibration, shaped: ShapePlan) -> dict[str, Any]:
    doc: dict[str, Any] = {"timed_shapes": shaped.describe(), "forward_layers": shaped.layers}
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

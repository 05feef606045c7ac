"""`kvsim calibrate import-vidur`: a measured profile from Vidur's public profiling CSVs.

Vidur (github.com/microsoft/vidur, MIT licence) publishes kernel times for several models on A100
and H100 nodes; kvsim.calibrate.vidur reads them. This module turns one model at one TP degree
into the ``[measured]`` tables that kvsim calibrate would write on that GPU:

- GEMMs: Vidur's four projections at the TP degree, every measured token count;
- elementwise: the sum of Vidur's five elementwise operations of a layer;
- prefill attention: chunks without context, every chunk size; with context, one point per
  eighth of a decade of (query, key) pairs (the point of median time), since kvsim's table is
  one curve in pairs while Vidur's points cover (chunk, context);
- decode attention: the (batch, context) grid at about two points per doubling of each;
- all-reduce: Vidur's single-node points at the TP degree, one per twelfth of a decade of bytes;
- overhead: Vidur's CPU overheads for the model and TP degree (schedule, prepare inputs,
  sampler, process outputs), else the base profile's iteration overhead.

What Vidur lacks (the LM head always; attention or all-reduce at some shapes) is filled from the
base profile's kernel roofline (kvsim.costmodel.kernels) and listed in ``filled_from_roofline``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.atomic import write_file
from kvsim.calibrate.vidur import (
    ELEMENTWISE_OPS,
    GEMM_OPS,
    _read,
    read_allreduce,
    read_attention,
    read_mlp,
)
from kvsim.costmodel.family_rooflines import LayerAttention as _Attention
from kvsim.costmodel.kernels import KernelRates
from kvsim.costmodel.shapes import gemm_shapes, supported
from kvsim.engines import load_engine
from kvsim.errors import ConfigError
from kvsim.hardware.attention_pairs import causal_pairs as _pairs
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec
from kvsim.tomlwrite import dumps

VIDUR_REPO = "https://github.com/microsoft/vidur"
LICENCE = "MIT"
DTYPE = "fp16"  # Vidur profiles every kernel in torch.float16 (vidur/profiling)
#: Vidur's GPU folder names and the shipped profile each matches.
GPU_PROFILES = {"a100": "a100-80gb", "h100": "h100-sxm"}
#: Vidur's CPU overhead columns that make up one engine iteration outside the model (ms).
OVERHEAD_COLUMNS = (
    "schedule_median",
    "prepare_inputs_e2e_median",
    "sampler_e2e_median",
    "process_model_outputs_median",
)
# roofline grids for what Vidur lacks: powers of two over what a serving engine schedules
LM_HEAD_SEQUENCES = [2**i for i in range(13)]  # 1 ... 4096
PREFILL_TOKENS = [2**i for i in range(4, 14)]  # 16 ... 8192
DECODE_BATCH = [2**i for i in range(10)]  # 1 ... 512
DECODE_CONTEXT = [2**i for i in range(4, 18)]  # 16 ... 131072


@dataclass(frozen=True)
class VidurFiles:
    """The CSVs of one model on one GPU; optional ones are None when absent."""

    root: Path
    gpu: str | None
    mlp: Path
    attention: Path | None
    allreduce: Path | None
    overheads: Path | None


@dataclass
class Imported:
    """What the import made: the profile text, its tables, and what was filled or noted."""

    text: str
    measured: dict[str, Any]
    base: str
    filled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def locate(folder: Path, model: ModelSpec, gpu: str | None, base: str | None) -> VidurFiles:
    """Vidur's files for ``model``: in Vidur's ``data/profiling`` layout, or a flat folder."""
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder (expected Vidur's data/profiling)")
    if (folder / "mlp.csv").is_file():
        return VidurFiles(
            folder,
            gpu,
            folder / "mlp.csv",
            _optional(folder / "attention.csv"),
            _optional(folder / "all_reduce.csv"),
            _optional(folder / "cpu_overheads.csv"),
        )
    compute = folder / "compute"
    if not compute.is_dir():
        raise ConfigError(
            f"{folder}: neither Vidur's data/profiling layout (compute/<gpu>/<org>/<model>/mlp.csv)"
            " nor a folder holding mlp.csv"
        )
    found = sorted(d.name for d in compute.iterdir() if (d / model.hf_config / "mlp.csv").is_file())
    if not found:
        raise ConfigError(f"{compute}: no <gpu>/{model.hf_config}/mlp.csv for --model {model.name}")
    if gpu is None and base is not None:
        by_base = [g for g in found if GPU_PROFILES.get(g) == Path(base).stem]
        gpu = by_base[0] if by_base else None
    if gpu is None and len(found) == 1:
        gpu = found[0]
    if gpu not in found:
        have = ", ".join(found)
        what = f"--gpu {gpu}: not among" if gpu else "--gpu: name one of"
        raise ConfigError(f"{what} the GPUs profiled for {model.hf_config} in {compute} ({have})")
    here = compute / gpu / model.hf_config
    return VidurFiles(
        folder,
        gpu,
        here / "mlp.csv",
        _optional(here / "attention.csv"),
        _optional(folder / "network" / f"{gpu}_dgx" / "all_reduce.csv"),
        _optional(folder / gpu / "cpu_overheads.csv") or _optional(folder / "cpu_overheads.csv"),
    )


def _optional(path: Path) -> Path | None:
    return path if path.is_file() else None


def git_blob(path: Path) -> str:
    """The file's git blob hash, which names its exact content in any commit of Vidur."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


# -- checks ---------------------------------------------------------------------------------------
def check_shapes(path: Path, model: ModelSpec, hidden, heads, kv_heads, inter, gated) -> None:
    """Refuse Vidur's data when its layer shapes are not the model's."""
    g = model.layer_groups[0]
    want_inter = model.mlp_groups[0].intermediate_size
    # an ungated MLP (phi-2) is in the catalog as a gated one of equal weights: 2 h f = 3 h f'
    inter_ok = inter == want_inter if gated else abs(2 * inter - 3 * want_inter) <= 3
    if (hidden, heads, kv_heads) != (
        model.hidden_size,
        g.num_heads,
        g.num_kv_heads,
    ) or not inter_ok:
        raise ConfigError(
            f"{path}: Vidur's shapes (n_embd {hidden}, n_head {heads}, n_kv_head {kv_heads}, "
            f"n_expanded_embd {inter}{'' if gated else ' ungated'}) are not {model.name}'s "
            f"(hidden {model.hidden_size}, heads {g.num_heads}, kv heads {g.num_kv_heads}, "
            f"intermediate {want_inter})"
        )


def _check_model(model: ModelSpec) -> None:
    reason = supported(model)
    kinds = {g.kind for g in model.layer_groups}
    if reason is None and kinds != {"full"}:
        reason = f"{model.name}: layer kinds {sorted(kinds)}"
    if reason is None and not model.mlp_groups:
        reason = f"{model.name}: no MLP"
    if reason:
        raise ConfigError(
            f"--model: Vidur's tables describe dense full-attention models, not {reason}"
        )


def _positive(x: np.ndarray, t: np.ndarray) -> tuple[list[int], list[float]]:
    """Points with a positive time (Vidur rounds to 1 us and writes 0 below it)."""
    keep = np.isfinite(t) & (t > 0)
    return [int(v) for v in x[keep]], _seconds(t[keep])


def _seconds(values) -> list[float]:
    """Vidur's milliseconds as seconds, without the binary noise of the conversion."""
    return [float(f"{float(v):.12g}") for v in np.ravel(values)]


def thin(x: np.ndarray, t: np.ndarray, per_decade: int, min_points: int = 5) -> np.ndarray:
    """Indices of real points to keep, in increasing ``x``: one per 1/per_decade of a decade of
    ``x`` (bins widened until they hold ``min_points``), the point of median time in each (lower
    median), so a curve through them follows the measurements but not every noisy outlier."""
    order = np.argsort(x, kind="stable")
    bins = np.floor(np.log10(x[order]) * per_decade + 1e-9)
    groups: list[list[int]] = []
    for b in np.unique(bins):
        idx = order[bins == b].tolist()
        if groups and len(groups[-1]) < min_points:
            groups[-1] += idx
        else:
            groups.append(idx)
    if len(groups) > 1 and len(groups[-1]) < min_points:
        last = groups.pop()
        groups[-1] += last
    keep = []
    for idx in groups:
        ix = np.array(idx)
        keep.append(int(ix[np.argsort(t[ix], kind="stable")[(len(ix) - 1) // 2]]))
    return np.array(sorted(keep, key=lambda i: (x[i], i)), dtype=np.int64)


def two_per_octave(values: np.ndarray) -> list[int]:
    """The values nearest 1, 1.41, 2, 2.83, ... times the smallest (and the largest)."""
    values = np.unique(values)
    targets = values[0] * np.sqrt(2.0) ** np.arange(
        int(np.ceil(2 * np.log2(values[-1] / values[0]))) + 1
    )
    picks = {int(values[np.argmin(np.abs(np.log(values / v)))]) for v in targets}
    return sorted(picks | {int(values[-1])})


# -- tables from Vidur's data -------------------------------------------------------------------
def _gemm_tables(files: VidurFiles, model: ModelSpec, tp: int) -> tuple[dict, dict, list[str]]:
    mlp = read_mlp(files.mlp)
    check_shapes(files.mlp, model, mlp.hidden, mlp.heads, mlp.kv_heads, mlp.intermediate, mlp.gated)
    at = mlp.tp == tp
    if not at.any():
        have = ", ".join(str(v) for v in sorted(set(mlp.tp.tolist())))
        raise ConfigError(f"{files.mlp}: no rows at --tp {tp} (Vidur profiled tp {have})")
    tokens = mlp.tokens[at]
    shapes = gemm_shapes(model, tp)
    unknown = set(shapes) - {*GEMM_OPS, "lm_head"}
    if unknown:
        raise ConfigError(f"--model {model.name}: GEMM roles {sorted(unknown)} Vidur does not time")
    width = max(1, mlp.intermediate // tp)  # an ungated MLP's real width (see check_shapes)
    notes = []
    gemm = {}
    for role, op in GEMM_OPS.items():
        s = shapes[role]
        k, n = s.k, s.n
        if not mlp.gated and role == "gate_up":
            n = width
        if not mlp.gated and role == "down":
            k = width
        x, secs = _positive(tokens, mlp.seconds[op][at])
        if not x:
            raise ConfigError(f"{files.mlp}: no positive time_stats.{op}.median at tp {tp}")
        if len(x) < len(tokens):
            notes.append(f"gemm.{role}: {len(tokens) - len(x)} points under 1 us dropped")
        gemm[role] = {"k": k, "n": n, "calls": s.calls, "per": "token", "tokens": x}
        gemm[role]["seconds"] = secs
    total = sum(mlp.seconds[op][at] for op in ELEMENTWISE_OPS)
    x, secs = _positive(tokens, total)
    if not x:
        raise ConfigError(f"{files.mlp}: no positive elementwise times at tp {tp}")
    return gemm, {"tokens": x, "seconds": secs}, notes


def _attention_tables(files: VidurFiles, model: ModelSpec, tp: int) -> tuple[dict, str | None]:
    """The three attention tables from attention.csv, or ({}, why not)."""
    if files.attention is None:
        return {}, "no attention.csv"
    att = read_attention(files.attention)
    g = model.layer_groups[0]
    if (att.hidden, att.heads, att.kv_heads) != (model.hidden_size, g.num_heads, g.num_kv_heads):
        return {}, (
            f"attention.csv is for n_embd {att.hidden}, n_q_head {att.heads}, n_kv_head "
            f"{att.kv_heads}, not {model.name}'s shapes"
        )
    if not (att.tp == tp).any():
        have = ", ".join(str(v) for v in sorted(set(att.tp.tolist())))
        return {}, f"attention.csv has no rows at tp {tp} (has tp {have})"
    frame = pd.DataFrame(
        {
            "prefill": att.is_prefill,
            "chunk": att.chunk,
            "batch": att.batch,
            "context": att.context,
            "seconds": att.seconds,
        }
    )[att.tp == tp]
    tables: dict[str, Any] = {}
    pre = frame[frame.prefill & (frame.batch == 1) & (frame.chunk > 0)]
    pre = pre.groupby(["chunk", "context"], as_index=False).seconds.median()
    fresh = pre[pre.context == 0].sort_values("chunk")
    if not fresh.empty:
        tables["prefill_attention"] = {
            "tokens": [int(v) for v in fresh.chunk],
            "context": [0] * len(fresh),
            "seconds": _seconds(fresh.seconds),
        }
    cached = pre[pre.context > 0]
    if not cached.empty:
        pairs = np.array([_pairs(n, c) for n, c in zip(cached.chunk, cached.context, strict=True)])
        rows = cached.iloc[thin(pairs, cached.seconds.to_numpy(), 8)]
        tables["prefill_attention_cached"] = {
            "tokens": [int(v) for v in rows.chunk],
            "context": [int(v) for v in rows.context],
            "seconds": _seconds(rows.seconds),
        }
    dec = frame[~frame.prefill & (frame.batch > 0) & (frame.context > 0)]
    grid = dec.pivot_table(index="batch", columns="context", values="seconds", aggfunc="median")
    if not grid.empty:
        grid = grid.loc[
            two_per_octave(grid.index.to_numpy()), two_per_octave(grid.columns.to_numpy())
        ]
        grid = grid.dropna(axis=1, how="any").dropna(axis=0, how="any")
        grid = grid.loc[(grid > 0).all(axis=1), (grid > 0).all(axis=0)]
    if not grid.empty:
        tables["decode_attention"] = {
            "batch": [int(v) for v in grid.index],
            "context": [int(v) for v in grid.columns],
            "seconds": [_seconds(row) for row in grid.to_numpy()],
        }
    missing = [k for k in ("prefill_attention", "decode_attention") if k not in tables]
    return tables, (f"attention.csv has no {' or '.join(missing)} rows" if missing else None)


def _allreduce_table(files: VidurFiles, tp: int) -> tuple[dict | None, str | None]:
    if tp == 1:
        return None, None
    if files.allreduce is None:
        return None, "no all_reduce.csv"
    ar = read_allreduce(files.allreduce)
    at = (ar.gpus == tp) & (ar.seconds > 0) & (ar.nbytes > 0)
    if not at.any():
        have = ", ".join(str(v) for v in sorted(set(ar.gpus.tolist())))
        return None, f"all_reduce.csv has no single-node rows at {tp} GPUs (has {have})"
    nbytes, seconds = ar.nbytes[at], ar.seconds[at]
    uniq = pd.Series(seconds).groupby(nbytes).median()
    x, t = uniq.index.to_numpy(dtype=np.float64), uniq.to_numpy()
    keep = thin(x, t, 8, min_points=8)
    return {"bytes": [int(v) for v in x[keep]], "seconds": _seconds(t[keep])}, None


def _overhead_s(files: VidurFiles, model: ModelSpec, tp: int, base: HardwareProfile) -> tuple:
    """(seconds, where from): Vidur's CPU overheads for this model and TP, else the base's, else
    that of vLLM 0.6 (kvsim.engines), the era Vidur profiled."""
    fallback = base.efficiency.iteration_overhead_s
    source = "base profile's iteration_overhead_s"
    if fallback is None:
        fallback = load_engine("vllm@0.6").iteration_overhead_s
        source = "engine profile vllm@0.6's iteration_overhead_s"
    if files.overheads is None:
        return fallback, f"{source} (no cpu_overheads.csv)"
    frame = _read(files.overheads, [*OVERHEAD_COLUMNS, "model_name", "tensor_parallel_degree"])
    rows = frame[(frame.model_name == model.hf_config) & (frame.tensor_parallel_degree == tp)]
    if rows.empty:
        return (
            fallback,
            f"{source} (cpu_overheads.csv: no rows for tp {tp})",
        )
    per_row = rows[list(OVERHEAD_COLUMNS)].to_numpy(dtype=np.float64).sum(axis=1) * 1e-3
    return float(np.median(per_row)), "cpu_overheads.csv: median over batch sizes"


# -- roofline fills -------------------------------------------------------------------------------
def _lm_head(model: ModelSpec, tp: int, rates: KernelRates) -> dict:
    s = gemm_shapes(model, tp)["lm_head"]
    m = np.array(LM_HEAD_SEQUENCES, dtype=np.float64)
    secs = rates.gemm_s(2.0 * m * s.k * s.n, (s.k * s.n + m * (s.k + s.n)) * 2.0)
    return {
        "k": s.k,
        "n": s.n,
        "calls": s.calls,
        "per": "sequence",
        "tokens": LM_HEAD_SEQUENCES,
        "seconds": [float(v) for v in secs],
    }


def _attention_fill(
    model: ModelSpec, tp: int, rates: KernelRates, kv_dtype: str = DTYPE
) -> dict[str, dict]:
    """Attention tables priced by the base profile's kernel roofline, over wide grids."""
    att = _Attention(model, tp, kv_dtype)
    n = np.array(PREFILL_TOKENS, dtype=np.float64)

    def prefill(context: np.ndarray) -> dict:
        pairs = n * context + n * (n + 1) / 2
        nbytes = (n + context) * att.kv_bpt + n * att.q_bytes_per_token
        secs = rates.attention_s(pairs * att.prefill_fpp, nbytes)
        return {
            "tokens": PREFILL_TOKENS,
            "context": [int(c) for c in context],
            "seconds": [float(v) for v in secs],
        }

    b = np.array(DECODE_BATCH, dtype=np.float64)[:, None]
    c = np.array(DECODE_CONTEXT, dtype=np.float64)[None, :]
    keys = b * (c + 1)
    secs = rates.attention_s(keys * att.decode_fpp, keys * att.kv_bpt + b * att.q_bytes_per_token)
    return {
        "prefill_attention": prefill(np.zeros_like(n)),
        "prefill_attention_cached": prefill(3 * n),
        "decode_attention": {
            "batch": DECODE_BATCH,
            "context": DECODE_CONTEXT,
            "seconds": [[float(v) for v in row] for row in secs],
        },
    }


# -- the profile -----------------------------------------------------------------------------------
def import_vidur(
    folder: Path,
    model: ModelSpec,
    tp: int,
    out: Path,
    base: HardwareProfile,
    base_text: str,
    *,
    gpu: str | None = None,
    commit: str | None = None,
    note: str | None = None,
) -> Imported:
    """The profile ``out`` as text: ``base`` plus ``[measured]`` tables from Vidur's CSVs."""
    _check_model(model)
    if base.measured:
        raise ConfigError(
            f"--profile {base.name}: already has [measured] tables; name a datasheet profile"
        )
    files = locate(folder, model, gpu, str(base.source_path or base.name))
    rates = KernelRates.of(base, "bf16")
    gemm, elementwise, notes = _gemm_tables(files, model, tp)
    gemm["lm_head"] = _lm_head(model, tp, rates)
    filled = ["gemm.lm_head"]
    notes.insert(0, "gemm.lm_head: Vidur does not time the LM head")
    attention, why = _attention_tables(files, model, tp)
    fill = _attention_fill(model, tp, rates)
    for key in ("prefill_attention", "decode_attention", "prefill_attention_cached"):
        if key not in attention:
            attention[key] = fill[key]
            filled.append(key)
            notes.append(f"{key}: {why or 'no rows with a cached context in attention.csv'}")
    allreduce, why = _allreduce_table(files, tp)
    if why:
        filled.append("allreduce")
        notes.append(f"allreduce: {why}; the profile's all-reduce algorithms price it")
    overhead, overhead_from = _overhead_s(files, model, tp, base)
    notes.append(f"overhead_s {overhead * 1e3:.3f} ms: {overhead_from}")
    used = [p for p in (files.mlp, files.attention, files.allreduce, files.overheads) if p]
    measured: dict[str, Any] = {
        "format": 1,
        "device": base.gpu.name,
        "device_kind": "cuda",
        "driver": "not recorded in Vidur's CSVs",
        "torch": "not recorded in Vidur's CSVs",
        "date": "not recorded in Vidur's CSVs",
        "source": VIDUR_REPO,
        "source_commit": commit or "not given (see source_files for the files' git blob hashes)",
        "licence": LICENCE,
        "source_files": [
            f"{p.relative_to(files.root).as_posix()} (git blob {git_blob(p)})" for p in used
        ],
        "filled_from_roofline": filled,
        "model": model.name,
        "tp": tp,
        "dtype": DTYPE,
        "kv_dtype": DTYPE,
        "overhead_s": overhead,
        "gemm": gemm,
        "elementwise": elementwise,
        **attention,
    }
    if note:
        measured["source_note"] = note
    if allreduce is not None:
        measured["allreduce"] = allreduce
    text = profile_text(base_text, out.stem, base, model, tp, files, measured)
    return Imported(text, measured, base.name, filled, notes)


def profile_text(
    base_text: str,
    name: str,
    base: HardwareProfile,
    model: ModelSpec,
    tp: int,
    files: VidurFiles,
    measured: dict[str, Any],
) -> str:
    """The base profile's own text (every datasheet number and source kept as written), renamed,
    with ``[measured]`` appended."""
    description = (
        f"{base.description}; kernel tables of {model.name} at tp={tp} from Vidur's profiling "
        f"data{f' ({files.gpu})' if files.gpu else ''}, MIT licence"
    )
    header = [
        "# Written by `kvsim calibrate import-vidur` (docs/calibration.md): the base profile "
        f"{base.name} with",
        "# [measured] tables from Vidur's public profiling data (github.com/microsoft/vidur, "
        "MIT licence,",
        "# Copyright (c) Microsoft Corporation); provenance and gaps filled from the roofline "
        "are in [measured].",
    ]
    return render_profile(base_text, name, base, description, header, measured)


def render_profile(
    base_text: str,
    name: str,
    base: HardwareProfile,
    description: str,
    header: list[str],
    measured: dict[str, Any],
) -> str:
    """``base_text`` renamed to ``name`` with ``description``, under the comment lines
    ``header``, with ``[measured]`` appended (every importer writes its profile this way)."""
    head, sep, rest = base_text.partition("\n[")
    head, named = re.subn(r"(?m)^name\s*=.*$", lambda _: f"name = {_toml_str(name)}", head, count=1)
    head, described = re.subn(
        r"(?m)^description\s*=.*$",
        lambda _: f"description = {_toml_str(description)}",
        head,
        count=1,
    )
    if not named or not described:
        raise ConfigError(
            f"--profile {base.name}: no top-level name and description lines to rename"
        )
    lines = [
        *header,
        head.rstrip("\n") + ("\n" + sep if sep else "") + rest.rstrip("\n"),
        "",
        dumps({"measured": measured}).rstrip(),
    ]
    return "\n".join(lines) + "\n"


def _toml_str(text: str) -> str:
    return dumps({"x": text}).split("=", 1)[1].strip()


def write_atomically(
    out: Path, text: str, check: Callable[[Path], Any], overwrite: bool = False
) -> Any:
    """Write ``text`` to ``out`` only if ``check(path)`` accepts it, so a failure leaves nothing
    (`kvsim.atomic.write_file`: a WriteError line when it cannot be written; an existing file
    is replaced only with `overwrite`)."""
    return write_file(
        out, text, what="the profile", overwrite=overwrite, make_parents=True, check=check
    )

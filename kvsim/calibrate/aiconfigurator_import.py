"""`kvsim calibrate import-aiconfigurator`: a measured profile from NVIDIA's kernel database.

AIConfigurator's tables (kvsim.calibrate.aiconfigurator_data) time GEMMs, prefill and decode
attention and all-reduce under current vLLM, SGLang and TensorRT-LLM on nine GPUs. This module
turns one model at one TP degree, on one GPU under one engine, into the ``[measured]`` tables
`kvsim calibrate` would write there, the way `import-vidur` does (same format, same checks,
written whole through kvsim.atomic):

- GEMMs: each of the model's weight shapes at that TP degree, at every measured m. The database
  measures a grid of n and k (22 sizes from 32 to 65536 each); a shape between grid points is
  interpolated bilinearly in n and k from the measured shapes around it, at each m. Holding out
  each interior n of the wheel's bf16 tables (m <= 8192) and interpolating it from the grid
  points two steps apart, this misses by a median 3.1% / 90th percentile 11.9% (h100_sxm vLLM),
  6.9% / 25% (b200_sxm SGLang), 4.1% / 17.6% (a100_sxm TensorRT-LLM); interpolating the time
  per weight element in log n instead missed by 5.2% / 23% on h100_sxm. A shape outside the
  grid (an LM head wider than 65536) comes from the base profile's roofline;
- prefill attention: batch-1 prompts of every measured length, no cached context;
- decode attention: the (batch, context) grid as measured; the database skips the largest
  batch x context cells (over about 2M tokens of KV), which are scaled in proportion to batch
  from the largest measured batch at that context (decode attention there is bandwidth-bound);
- all-reduce at the TP degree, as the engine runs it: vLLM and SGLang use their custom
  all-reduce (CUDA-graph mode) up to its size limit and NCCL above; TensorRT-LLM its own;
- elementwise, prefill with a cached context, and the iteration overhead are not in the
  database: they come from the base profile (its kernel roofline and iteration overhead) and are
  named in ``filled_from_roofline`` or the notes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.calibrate.aiconfigurator_data import KernelDatabase
from kvsim.calibrate.vidur_import import (
    Imported,
    _attention_fill,
    _seconds,
    render_profile,
)
from kvsim.costmodel.family_rooflines import elementwise_roofline, gemm_roofline
from kvsim.costmodel.kernels import KernelRates
from kvsim.costmodel.shapes import gemm_shapes, supported
from kvsim.engines import load_engine
from kvsim.errors import ConfigError
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec, kv_heads_per_rank
from kvsim.models.dtypes import weight_dtype_bytes

#: AIConfigurator's GPU folders and kvsim's profile of each GPU (the fit script reads it too).
GPU_PROFILES = {
    "a100_sxm": "a100-80gb",
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200-sxm",
    "b200_sxm": "b200",
    "gb200": "gb200",
    "b300_sxm": "b300",
    "gb300": "gb300",
    "l40s": "l40s",
    "rtx_pro_6000_server": "rtx-pro-6000",
}
#: kvsim's dtype names and the database's.
GEMM_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
KV_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
#: The largest message (bytes) each engine's custom all-reduce takes; NCCL above it. TensorRT-LLM
#: has no entry: its own all-reduce op (the database's trtllm rows) chooses its strategy itself.
CUSTOM_ALLREDUCE_MAX_BYTES = {
    # source: vLLM vllm/distributed/device_communicators/custom_all_reduce.py: max_size 8 MiB
    "vllm": 8 * 2**20,
    # source: SGLang 0.5: custom all-reduce on by default up to 16 MiB, NCCL above
    # (kvsim/engines/profiles/sglang@0.5.toml)
    "sglang": 16 * 2**20,
}
ELEMENTWISE_TOKENS = [2**i for i in range(14)]  # 1 ... 8192, the roofline's grid


@dataclass(frozen=True)
class Request:
    """What to import: GPU and engine as the database names them, model, TP and dtypes."""

    gpu: str
    engine: str
    model: ModelSpec
    tp: int
    kv_dtype: str = "bf16"
    weight_dtype: str = "bf16"
    version: str | None = None


# -- GEMMs ----------------------------------------------------------------------------------------
def around(grid: np.ndarray, v: float) -> list[int] | None:
    """The grid point equal to ``v``, or the two around it; None outside the grid."""
    i = int(np.searchsorted(grid, v))
    if i < len(grid) and grid[i] == v:
        return [int(v)]
    if i == 0 or i == len(grid):
        return None
    return [int(grid[i - 1]), int(grid[i])]


def _weights(points: list[int], v: float) -> list[float]:
    """Linear weights of one or two grid points at ``v``."""
    if len(points) == 1:
        return [1.0]
    w = (v - points[0]) / (points[1] - points[0])
    return [1.0 - w, w]


def gemm_curve(rows: pd.DataFrame, n: int, k: int) -> tuple[list[int], list[float], str] | None:
    """(m values, seconds, how) of an ``m x k @ k x n`` GEMM from one dtype's rows, or None
    when (n, k) is outside the measured grid."""
    ns = around(np.unique(rows["n"].to_numpy()), n)
    ks = around(np.unique(rows["k"].to_numpy()), k)
    if ns is None or ks is None:
        return None
    corners = []
    for a, wa in zip(ns, _weights(ns, n), strict=True):
        for b, wb in zip(ks, _weights(ks, k), strict=True):
            at = rows[(rows["n"] == a) & (rows["k"] == b)]
            corners.append((wa * wb, at.groupby("m")["latency_s"].median()))
    common = sorted(set.intersection(*(set(s.index) for _, s in corners)))
    if not common:
        return None
    seconds = np.zeros(len(common))
    for w, s in corners:
        seconds += w * s.loc[common].to_numpy()
    exact = len(ns) == 1 and len(ks) == 1
    how = "measured" if exact else f"interpolated between n {ns} x k {ks}"
    return [int(m) for m in common], _seconds(seconds), how


def _gemm_tables(db: KernelDatabase, req: Request, rates: KernelRates) -> tuple:
    """(GEMM tables by role, roles filled, notes, the GPU name the table records)."""
    frame = db.gemm(req.gpu, req.engine, req.version)
    want = GEMM_DTYPES[req.weight_dtype]
    rows = frame[frame["dtype"] == want]
    if rows.empty:
        have = ", ".join(sorted(map(str, frame["dtype"].unique())))
        raise ConfigError(
            f"{frame.attrs['files'][0]}: no {want} GEMM rows (--weight-dtype "
            f"{req.weight_dtype}); it has {have}"
        )
    gemm, filled, notes = {}, [], []
    wbytes = weight_dtype_bytes(req.weight_dtype)
    for role, shape in gemm_shapes(req.model, req.tp).items():
        doc: dict[str, Any] = {"k": shape.k, "n": shape.n, "calls": shape.calls, "per": shape.per}
        got = gemm_curve(rows, shape.n, shape.k)
        if got is None:
            m = np.array(ELEMENTWISE_TOKENS, dtype=np.float64)
            secs = gemm_roofline(shape, rates, wbytes)(m)
            doc.update(tokens=[int(v) for v in m], seconds=[float(v) for v in secs])
            filled.append(f"gemm.{role}")
            notes.append(f"gemm.{role}: n {shape.n} x k {shape.k} is outside the measured grid")
        else:
            tokens, secs, how = got
            doc.update(tokens=tokens, seconds=secs)
            if how != "measured":
                notes.append(f"gemm.{role}: n {shape.n} x k {shape.k} {how}")
        gemm[role] = doc
    names = frame["device"].dropna().astype(str).unique() if "device" in frame.columns else []
    return gemm, filled, notes, (str(names[0]) if len(names) else None)


# -- attention ------------------------------------------------------------------------------------
def _shape_rows(frame: pd.DataFrame, req: Request) -> tuple[pd.DataFrame, str]:
    """Rows of the model's per-GPU attention shape, KV dtype and full attention."""
    g = req.model.layer_groups[0]
    heads = max(1, g.num_heads // req.tp)
    kvh = kv_heads_per_rank(g.num_kv_heads, req.tp)
    kv = KV_DTYPES[req.kv_dtype]
    at = (
        (frame["num_heads"] == heads)
        & (frame["num_kv_heads"] == kvh)
        & (frame["head_dim"] == g.head_dim_k)
        & (frame["kv_dtype"] == kv)
        & (frame["window"] == 0)
    )
    return frame[at], f"{heads} heads, {kvh} KV heads, head dim {g.head_dim_k}, KV {kv}"


def _prefill_table(db: KernelDatabase, req: Request) -> tuple[dict | None, str]:
    rows, what = _shape_rows(db.context_attention(req.gpu, req.engine, req.version), req)
    rows = rows[rows["batch"] == 1].groupby("isl")["latency_s"].median()
    if rows.empty:
        return None, f"prefill_attention: no batch-1 rows for {what}"
    return {
        "tokens": [int(v) for v in rows.index],
        "context": [0] * len(rows),
        "seconds": _seconds(rows.to_numpy()),
    }, what


def _decode_table(db: KernelDatabase, req: Request) -> tuple[dict | None, str]:
    rows, what = _shape_rows(db.generation_attention(req.gpu, req.engine, req.version), req)
    if rows.empty:
        return None, f"decode_attention: no rows for {what}"
    grid = (
        rows.pivot_table(
            index="batch", columns="context_tokens", values="latency_s", aggfunc="median"
        )
        .sort_index(axis=0)
        .sort_index(axis=1)
    )
    values = grid.to_numpy(dtype=np.float64, copy=True)
    batch = grid.index.to_numpy(dtype=np.float64)
    scaled = 0
    for j in range(values.shape[1]):
        measured = np.flatnonzero(np.isfinite(values[:, j]))
        if measured.size == 0:
            continue
        top = measured[-1]
        for i in range(top + 1, values.shape[0]):
            values[i, j] = values[top, j] * batch[i] / batch[top]
            scaled += 1
    keep = np.isfinite(values).all(axis=0)  # a context nobody measured at small batch: dropped
    note = (
        f"decode_attention: {scaled} of {values.size} (batch, context) cells the database does "
        "not measure scaled in proportion to batch from the largest measured batch at that "
        "context"
    )
    return {
        "batch": [int(v) for v in grid.index],
        "context": [int(v) for v in grid.columns[keep]],
        "seconds": [_seconds(row) for row in values[:, keep]],
    }, note


# -- all-reduce -----------------------------------------------------------------------------------
def _allreduce_table(db: KernelDatabase, req: Request) -> tuple[dict | None, str]:
    """(table, how) of one all-reduce over ``tp`` GPUs as the engine runs it; (None, why)."""
    frame = db.allreduce(req.gpu, req.engine)
    at = frame[(frame["num_gpus"] == req.tp) & frame["dtype"].isin(["bfloat16", "half"])]
    limit = CUSTOM_ALLREDUCE_MAX_BYTES.get(req.engine)
    nccl = at[at["implementation"] == "nccl"]
    if limit is None:
        own = at[at["implementation"] == req.engine]
        how = f"{req.engine}'s own all-reduce"
        if own.empty:  # e.g. GB300 at 8 GPUs: only TensorRT-LLM's multi-node NVLink kernels
            variants = at[at["implementation"].str.startswith(req.engine + "_")]
            names = sorted(set(variants["implementation"]))
            own = variants.loc[variants.groupby("message_bytes")["latency_s"].idxmin()]
            how = f"the faster per size of {req.engine}'s {' / '.join(names)}"
        if own.empty:
            own, how = nccl, f"NCCL ({req.engine} has no rows at {req.tp} GPUs)"
    else:
        custom = at[(at["implementation"] == "custom_graph") & (at["message_bytes"] <= limit)]
        own = pd.concat([custom, nccl[nccl["message_bytes"] > limit]])
        how = f"{req.engine} custom all-reduce (CUDA graph) up to {limit} bytes, NCCL above"
        if custom.empty:
            own, how = nccl, f"NCCL ({req.engine}'s custom all-reduce has no rows at {req.tp} GPUs)"
    if own.empty:
        kinds = {"nccl", req.engine} if limit is None else {"nccl", "custom_graph"}
        usable = frame[frame["implementation"].isin(kinds)]
        have = ", ".join(str(v) for v in sorted(set(usable["num_gpus"].tolist())))
        return None, (
            f"no {' or '.join(sorted(kinds))} all-reduce rows at {req.tp} GPUs (they have "
            f"{have or 'none'})"
        )
    series = own.groupby("message_bytes")["latency_s"].median()
    return {"bytes": [int(v) for v in series.index], "seconds": _seconds(series.to_numpy())}, how


# -- the profile ----------------------------------------------------------------------------------
def check_request(req: Request) -> None:
    """Refuse what the database or the measured cost model cannot describe, in one line."""
    reason = supported(req.model)
    kinds = {g.kind for g in req.model.layer_groups}
    if reason is None and not kinds <= {"full", "sliding"}:
        reason = f"{req.model.name}: layer kinds {sorted(kinds)}"
    if reason is None and not req.model.mlp_groups:
        reason = f"{req.model.name}: no MLP"
    if reason:
        raise ConfigError(
            "--model: the imported tables describe dense models with one GQA/MHA attention "
            f"shape, not {reason}"
        )
    if req.weight_dtype not in GEMM_DTYPES:
        raise ConfigError(
            f"--weight-dtype {req.weight_dtype}: the database's GEMMs are in "
            f"{', '.join(GEMM_DTYPES)}"
        )
    if req.kv_dtype not in KV_DTYPES:
        raise ConfigError(
            f"--kv-dtype {req.kv_dtype}: the database's attention is in {', '.join(KV_DTYPES)}"
        )


def import_aiconfigurator(
    db: KernelDatabase, req: Request, out: Path, base: HardwareProfile, base_text: str
) -> Imported:
    """The profile ``out`` as text: ``base`` plus ``[measured]`` tables from the database."""
    check_request(req)
    if base.measured:
        raise ConfigError(
            f"--profile {base.name}: already has [measured] tables; name a datasheet profile"
        )
    rates = KernelRates.of(base, req.weight_dtype)
    gemm, filled, notes, device = _gemm_tables(db, req, rates)
    fill = _attention_fill(req.model, req.tp, rates, req.kv_dtype)
    measured_attention: dict[str, Any] = {}
    prefill, what = _prefill_table(db, req)
    if prefill is None:
        filled.append("prefill_attention")
        notes.append(what)
        prefill = fill["prefill_attention"]
    measured_attention["prefill_attention"] = prefill
    measured_attention["prefill_attention_cached"] = fill["prefill_attention_cached"]
    filled.append("prefill_attention_cached")
    notes.append("prefill_attention_cached: the database times prompts without a cached prefix")
    decode, note = _decode_table(db, req)
    if decode is None:
        filled.append("decode_attention")
        decode = fill["decode_attention"]
    notes.append(note)
    measured_attention["decode_attention"] = decode
    elementwise_s = elementwise_roofline(req.model, req.tp, rates)
    elementwise = {
        "tokens": ELEMENTWISE_TOKENS,
        "seconds": [float(v) for v in elementwise_s(np.array(ELEMENTWISE_TOKENS, dtype=float))],
    }
    filled.append("elementwise")
    notes.append("elementwise: the database does not time norms, RoPE, activations or adds")
    allreduce = None
    if req.tp > 1:
        allreduce, how = _allreduce_table(db, req)
        if allreduce is None:
            filled.append("allreduce")
            notes.append(f"allreduce: {how}; the profile's all-reduce algorithms price it")
        else:
            notes.append(f"allreduce: {how}")
    overhead = base.efficiency.iteration_overhead_s
    where = "the base profile's iteration_overhead_s"
    if overhead is None:  # the CPU side is the serving engine's (kvsim.engines)
        engine = load_engine(req.engine)
        overhead, where = engine.iteration_overhead_s, f"engine {engine.full_name}'s"
    notes.append(
        f"overhead_s {overhead * 1e3:.3f} ms: {where} iteration_overhead_s "
        "(the database times kernels only)"
    )
    prov = db.provenance()
    versions = sorted({f.split("/")[3] + " " + f.split("/")[4] for f in db.files_read})
    measured: dict[str, Any] = {
        "format": 1,
        "device": device or base.gpu.name,
        "device_kind": "cuda",
        "driver": "not recorded in the kernel tables (see the wheel's collection_meta.yaml)",
        "torch": "not recorded in the kernel tables (see the wheel's collection_meta.yaml)",
        "date": "not recorded in the kernel tables",
        "source": f"NVIDIA AIConfigurator kernel database, {prov['package']} "
        f"{prov['wheel_version']} ({prov['source']})",
        "source_commit": _wheel_identity(db),
        "source_note": f"gpu {req.gpu}, engine {req.engine}; tables of {', '.join(versions)}; "
        f"read from the {db.kind} {db.root.name}",
        "licence": prov["licence"],
        "source_files": [_file_line(f) for f in prov["files"]],
        "filled_from_roofline": filled,
        "model": req.model.name,
        "tp": req.tp,
        "dtype": req.weight_dtype,
        "kv_dtype": req.kv_dtype,
        "overhead_s": overhead,
        "gemm": gemm,
        "elementwise": elementwise,
        **measured_attention,
    }
    if allreduce is not None:
        measured["allreduce"] = allreduce
    description = (
        f"{base.description}; kernel tables of {req.model.name} at tp={req.tp} under "
        f"{req.engine} on {req.gpu} from NVIDIA's AIConfigurator database "
        f"({prov['package']} {prov['wheel_version']}), Apache-2.0"
    )
    header = [
        "# Written by `kvsim calibrate import-aiconfigurator` (docs/calibration.md): the base "
        f"profile {base.name} with",
        "# [measured] tables from NVIDIA's AIConfigurator kernel database (aiconfigurator-core "
        "on PyPI, Apache-2.0,",
        "# Copyright (c) NVIDIA CORPORATION & AFFILIATES); provenance and gaps filled from the "
        "roofline are in [measured].",
    ]
    text = render_profile(base_text, out.stem, base, description, header, measured)
    return Imported(text, measured, base.name, filled, notes)


def _file_line(entry: dict[str, str]) -> str:
    line = f"{entry['path']} (sha256 {entry['sha256']}"
    if "wheel_sha256" in entry:
        line += f"; rows kept from the wheel's table, sha256 {entry['wheel_sha256']}"
    return line + ")"


def _wheel_identity(db: KernelDatabase) -> str:
    """The wheel's sha256: hashed when the wheel was read, from the subset's manifest else."""
    if db.kind == "wheel":
        h = hashlib.sha256()
        with db.root.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return f"wheel {db.root.name} sha256 {h.hexdigest()}"
    if db.kind == "subset":
        import json

        doc = json.loads((db.root / "manifest.json").read_text(encoding="utf-8"))
        return f"wheel {doc.get('wheel', '?')} sha256 {doc.get('wheel_sha256', '?')}"
    return f"an extracted copy of aiconfigurator-core {db.wheel_version} (wheel hash not known)"

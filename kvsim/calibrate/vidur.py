"""Read Vidur's public profiling CSVs (github.com/microsoft/vidur, MIT licence).

Vidur profiles each operation of a decoder layer with PyTorch's Kineto tracer, one CSV per
model and GPU (``compute/<gpu>/<org>/<model>/mlp.csv`` and ``attention.csv``) and one per node
type for collectives (``network/<node>/all_reduce.csv``). Times are milliseconds; this module
returns seconds. Only the columns kvsim uses are read, and a missing one is named.

Vidur's ``all_reduce.csv`` ``size`` is read as bytes, the way Vidur's own predictor reads it
(it divides by 2 x hidden to get tokens). Read as fp16 elements instead, the 8-GPU A100 bus
bandwidth would be 385 GB/s, above NVLink3's 300 GB/s per direction: impossible.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.errors import ConfigError

#: Vidur's operation names for the GEMMs of a layer, by kvsim's GEMM role (measured.gemm_shapes).
GEMM_OPS = {
    "qkv": "attn_pre_proj",
    "o": "attn_post_proj",
    "gate_up": "mlp_up_proj",
    "down": "mlp_down_proj",
}
#: Vidur's elementwise operations of one layer (each once per layer as profiled).
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")


@dataclass(frozen=True)
class MlpProfile:
    """Per-layer times of the non-attention operations at each (tp, tokens)."""

    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    gated: bool
    tp: np.ndarray
    tokens: np.ndarray
    seconds: dict[str, np.ndarray]  # Vidur op name -> median seconds, aligned with tp/tokens

    @property
    def has_elementwise(self) -> bool:
        """Whether all five elementwise operations of a Llama-style layer were profiled."""
        return all(op in self.seconds for op in ELEMENTWISE_OPS)


@dataclass(frozen=True)
class AttentionProfile:
    """Attention kernel times at each point: prefill (chunk, context) or decode (batch, context)."""

    hidden: int
    heads: int
    kv_heads: int
    tp: np.ndarray
    is_prefill: np.ndarray
    chunk: np.ndarray
    batch: np.ndarray
    context: np.ndarray
    seconds: np.ndarray


@dataclass(frozen=True)
class AllReduceProfile:
    """All-reduce times by GPU count and message size."""

    gpus: np.ndarray
    nbytes: np.ndarray
    seconds: np.ndarray


def _read(path: Path, needed: list[str]) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError(f"{path}: no such Vidur profiling file")
    try:
        frame = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise ConfigError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ConfigError(f"{path}: missing column {missing[0]!r} of Vidur's profiling format")
    frame = frame.dropna(subset=needed)
    if frame.empty:
        raise ConfigError(f"{path}: no complete rows")
    return frame


def _median_s(frame: pd.DataFrame, op: str) -> np.ndarray:
    return frame[f"time_stats.{op}.median"].to_numpy(dtype=np.float64) * 1e-3


def read_mlp(path: str | Path) -> MlpProfile:
    """``mlp.csv``: one row per (tokens, tp), each op's median time per layer."""
    path = Path(path)
    shape = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp"]
    needed = [*(f"time_stats.{op}.median" for op in GEMM_OPS.values()), *shape]
    needed += ["num_tokens", "num_tensor_parallel_workers"]
    f = _read(path, needed)
    f = f.drop_duplicates(["num_tokens", "num_tensor_parallel_workers"], keep="last")
    f = f.sort_values(["num_tensor_parallel_workers", "num_tokens"], kind="stable")
    return MlpProfile(
        hidden=int(f.n_embd.iloc[0]),
        heads=int(f.n_head.iloc[0]),
        kv_heads=int(f.n_kv_head.iloc[0]),
        intermediate=int(f.n_expanded_embd.iloc[0]),
        gated=bool(f.use_gated_mlp.iloc[0]),
        tp=f.num_tensor_parallel_workers.to_numpy(dtype=np.int64),
        tokens=f.num_tokens.to_numpy(dtype=np.int64),
        seconds={
            op: _median_s(f, op)
            for op in (*GEMM_OPS.values(), *ELEMENTWISE_OPS)
            if f"time_stats.{op}.median" in f.columns  # phi-2 has no post-attention norm
        },
    )


def read_attention(path: str | Path) -> AttentionProfile:
    """``attention.csv``: prefill rows time ``attn_prefill``, decode rows ``attn_decode``."""
    path = Path(path)
    needed = ["n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "is_prefill"]
    needed += ["batch_size", "prefill_chunk_size", "kv_cache_size"]
    f = _read(path, needed)
    prefill = f.is_prefill.astype(str).str.lower().eq("true").to_numpy()
    seconds = np.where(
        prefill,
        f["time_stats.attn_prefill.median"].to_numpy(dtype=np.float64),
        f["time_stats.attn_decode.median"].to_numpy(dtype=np.float64),
    )
    ok = np.isfinite(seconds) & (seconds > 0)
    return AttentionProfile(
        hidden=int(f.n_embd.iloc[0]),
        heads=int(f.n_q_head.iloc[0]),
        kv_heads=int(f.n_kv_head.iloc[0]),
        tp=f.num_tensor_parallel_workers.to_numpy(dtype=np.int64)[ok],
        is_prefill=prefill[ok],
        chunk=f.prefill_chunk_size.to_numpy(dtype=np.int64)[ok],
        batch=f.batch_size.to_numpy(dtype=np.int64)[ok],
        context=f.kv_cache_size.to_numpy(dtype=np.int64)[ok],
        seconds=seconds[ok] * 1e-3,
    )


def read_allreduce(path: str | Path) -> AllReduceProfile:
    """``all_reduce.csv``: rows within one node (``devices_per_node == num_workers``) only."""
    path = Path(path)
    needed = ["time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"]
    f = _read(path, needed)
    if "collective" in f.columns:
        f = f[f.collective == "all_reduce"]
    f = f[f.devices_per_node == f.num_workers].sort_values(["num_workers", "size"])
    if f.empty:
        raise ConfigError(f"{path}: no all-reduce rows within one node")
    return AllReduceProfile(
        gpus=f.num_workers.to_numpy(dtype=np.int64),
        nbytes=f["size"].to_numpy(dtype=np.float64),
        seconds=_median_s(f, "all_reduce"),
    )

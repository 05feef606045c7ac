"""What one kernel of a forward pass costs: the terms the roofline alone leaves out.

A roofline says a kernel takes ``max(flops / peak, bytes / bandwidth)``. Real kernels, measured
(Vidur's profiling data for A100 and H100; see docs/validation.md), differ in four ways that this
module prices, each with a parameter in the profile's ``[efficiency]`` or ``[[allreduce]]``:

- **A fixed cost per kernel** (``kernel_floor_s``, ``attention_floor_s``): launch, prologue and the
  last partial wave. A decode attention layer never takes less than ~10-15 us on an A100 however
  little KV it reads; a TP-8 GEMM of 1,280 columns takes twice its roofline.
- **A soft ridge** (``ridge_sharpness``): near the memory/compute ridge (~128-512 tokens for a
  GEMM) a kernel reaches neither peak. The two limits combine as a p-norm,
  ``(compute^p + memory^p)^(1/p)``: ``p = inf`` is the sharp roofline, ``p = 2`` puts the ridge
  at 1.41x either limit.
- **Attention's own efficiency** (``attention``): FlashAttention prefill on A100 reaches 15-40 %
  of the tensor-core peak in the measurements, GEMMs 70-80 %.
- **Collectives** (``[[allreduce]]``): each all-reduce costs a latency plus its bytes over the
  algorithm's bus bandwidth, the cheapest algorithm winning, as NCCL's tuner picks one.

Everything here is a pure function of sizes, vectorised over numpy arrays so that a coalesced run
of decode steps is priced in one call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.hardware.profile import AllReduceAlgorithm, HardwareProfile

#: Elementwise kernels in one decoder layer as vLLM runs a Llama-style model: two fused
#: residual-add + RMSNorm, rotary embedding, SiLU-and-mul, and the KV-cache write
#: (vLLM ``LlamaDecoderLayer``; Vidur's profiles time the same five: two norms, rope, act, add).
ELEMENTWISE_KERNELS_PER_LAYER = 5


def elementwise_bytes_per_token(
    hidden: int, q_width: int, kv_width: int, intermediate: int, gated: bool, dtype_bytes: float
) -> float:
    """Bytes one token moves per layer outside GEMMs and attention: two RMSNorms (read + write
    the hidden state), two residual adds (read two, write one), RoPE on the query and key heads
    (read + write), the activation (gated: read two, write one; else read one, write one) and the
    KV-cache write. ``q_width`` / ``kv_width`` are the query / one of K,V widths per rank."""
    elements = 4 * hidden + 6 * hidden + 2 * (q_width + kv_width)
    elements += (3 if gated else 2) * intermediate + 2 * kv_width
    return elements * dtype_bytes


#: Query rows of one FlashAttention-3 forward tile on Hopper at head dim 128: one MMA warpgroup
#: (64 rows) while the packed rows fit in it, else two (128) (Dao-AILab/flash-attention,
#: hopper/heuristics.h ``use_one_mma_wg`` and hopper/tile_size.h ``tile_size_fwd_sm90``).
QUERY_TILE_ROWS_SMALL = 64
QUERY_TILE_ROWS = 128


def query_tile_waste(new: int, q_per_kv: float) -> float:
    """How many times its useful FLOPs a chunk of ``new`` query tokens computes against cached
    keys: FlashAttention-3 packs the query heads that share a KV head into one tile's rows
    (``pack_gqa``, always on for varlen batches, hopper/heuristics.h ``should_pack_gqa``) and
    computes whole tiles, so a 1-token chunk of a model with 4 query heads per KV head fills
    4 of 64 rows and does 16x the work it needs. vLLM V1 and SGLang run chunks over a cached
    prefix through this varlen kernel."""
    rows = max(1.0, new * q_per_kv)
    if rows <= QUERY_TILE_ROWS_SMALL:
        return QUERY_TILE_ROWS_SMALL / rows
    return math.ceil(rows / QUERY_TILE_ROWS) * QUERY_TILE_ROWS / rows


def as_float(x):
    """A scalar as a Python float, anything else as a float64 array. One kernel priced in Python
    floats gives the bits numpy's scalar arithmetic gives (the same IEEE operations and C `pow`),
    without numpy's per-call overhead, which dominates pricing one iteration."""
    if isinstance(x, (int, float)):
        return float(x)
    return np.asarray(x, dtype=np.float64)


def summed(contexts: Sequence[float] | np.ndarray) -> float:
    """A batch's summed context, with the bits numpy's pairwise sum gives: a list of ints is
    added exactly in Python (in any order then, and without numpy's per-call overhead, which
    dominates a coalesced decode run's pricing); anything else by numpy."""
    if isinstance(contexts, list):
        items: list[Any] = contexts  # ints or floats: compiled (kvsim.compiled), each kept as is
        total = sum(items)
        if isinstance(total, int):
            return float(total)
    return float(np.asarray(contexts, dtype=np.float64).sum())


def blend(compute_s: np.ndarray | float, memory_s: np.ndarray | float, p: float):
    """The soft roofline: the p-norm of the compute and memory times (p = inf is their max)."""
    if math.isinf(p):
        return np.maximum(compute_s, memory_s)
    if isinstance(compute_s, float) and isinstance(memory_s, float):
        top = max(compute_s, memory_s, 1e-300)
        return top * ((compute_s / top) ** p + (memory_s / top) ** p) ** (1.0 / p)
    c = np.asarray(compute_s, dtype=np.float64)
    m = np.asarray(memory_s, dtype=np.float64)
    tops = np.maximum(np.maximum(c, m), 1e-300)
    return tops * ((c / tops) ** p + (m / tops) ** p) ** (1.0 / p)


def allreduce_s(
    algorithms: tuple[AllReduceAlgorithm, ...], nbytes: np.ndarray | float, tp: int
) -> np.ndarray | float:
    """Seconds of one all-reduce of ``nbytes`` over ``tp`` GPUs: the fastest algorithm's
    ``latency + latency_per_gpu * (tp - 1) + nbytes * 2 (tp - 1) / tp / bus_bandwidth``.

    Bus bandwidth is nccl-tests' convention (algorithm bandwidth x 2 (n-1) / n), so a ring's
    figure and NVLS's compare directly."""
    if tp <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=np.float64)) if np.ndim(nbytes) else 0.0
    moved = as_float(nbytes) * 2.0 * (tp - 1) / tp
    best = None
    for a in algorithms:
        if tp < a.min_gpus:
            continue
        t = a.latency_s + a.latency_per_gpu_s * (tp - 1) + moved / a.bus_bandwidth_bytes_per_s
        if a.max_bytes is not None:  # a message of its limit or more goes to another algorithm
            if np.ndim(t):  # (vLLM and SGLang take a message only while inp_size < max_size)
                t = np.where(as_float(nbytes) >= a.max_bytes, np.inf, t)
            elif nbytes >= a.max_bytes:
                continue
        best = t if best is None else np.minimum(best, t)
    if best is not None and np.ndim(best) and np.isinf(best).any():
        best = np.where(np.isinf(best), _slowest(algorithms, moved, tp), best)
    if best is None:  # no algorithm applies at this size of group: the slowest is a ring anyway
        best = _slowest(algorithms, moved, tp)
    return best if np.ndim(best) else float(best)


def _slowest(algorithms: tuple[AllReduceAlgorithm, ...], moved, tp: int):
    """A message no algorithm takes (each has a size limit below it): the first algorithm's time,
    as if it had none; a profile's list should end with one without a limit (NCCL)."""
    a = algorithms[0]
    return a.latency_s + a.latency_per_gpu_s * (tp - 1) + moved / a.bus_bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True)
class KernelRates:
    """Achieved rates and fixed costs of one GPU for one compute dtype, from a profile."""

    gemm_flops_per_s: float
    attention_flops_per_s: float
    bytes_per_s: float
    elementwise_bytes_per_s: float
    ridge: float
    kernel_floor_s: float
    attention_floor_s: float
    elementwise_floor_s: float
    allreduce: tuple[AllReduceAlgorithm, ...]
    # decode attention on its own terms (bandwidth it reaches, fixed cost); None: priced with
    # prefill attention as one kernel, as before the engine profiles' kernel tables
    decode_attention_bytes_per_s: float | None = None
    decode_attention_floor_s: float = 0.0
    decode_attention_per_sequence_s: float = 0.0
    attention_ramp_tokens: float = 0.0

    @classmethod
    def of(cls, profile: HardwareProfile, compute_dtype: str = "bf16") -> KernelRates:
        """The rates at ``compute_dtype``'s peak, else the BF16 peak, else the largest given:
        a CPU calibrated in fp32 writes a profile whose only peak is fp32's."""
        gpu, eff = profile.gpu, profile.efficiency
        peaks = gpu.peak_flops_per_s
        peak = peaks.get(compute_dtype) or peaks.get("bf16") or max(peaks.values())
        return cls(
            gemm_flops_per_s=peak * eff.compute,
            attention_flops_per_s=peak * eff.attention_or_compute,
            bytes_per_s=gpu.hbm_bandwidth_bytes_per_s * eff.memory,
            elementwise_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s * eff.elementwise_or_memory,
            ridge=eff.ridge_sharpness,
            kernel_floor_s=eff.kernel_floor_s,
            attention_floor_s=eff.attention_floor_s,
            elementwise_floor_s=eff.elementwise_floor_s,
            allreduce=profile.allreduce_algorithms,
            decode_attention_bytes_per_s=None
            if eff.decode_attention is None
            else gpu.hbm_bandwidth_bytes_per_s * eff.decode_attention,
            decode_attention_floor_s=eff.attention_floor_s
            if eff.decode_attention_floor_s is None
            else eff.decode_attention_floor_s,
            decode_attention_per_sequence_s=eff.decode_attention_per_sequence_s or 0.0,
            attention_ramp_tokens=eff.attention_ramp_tokens or 0.0,
        )

    def gemm_s(self, flops, nbytes, kernels: float = 1.0):
        """``kernels`` GEMMs doing ``flops`` and moving ``nbytes`` between them."""
        memory = as_float(nbytes) / self.bytes_per_s
        compute = as_float(flops) / self.gemm_flops_per_s
        return kernels * self.kernel_floor_s + blend(compute, memory, self.ridge)

    def attention_s(self, flops, nbytes, layers: float = 1.0):
        """Attention over ``layers`` layers doing ``flops`` and reading/writing ``nbytes``."""
        memory = as_float(nbytes) / self.bytes_per_s
        compute = as_float(flops) / self.attention_flops_per_s
        return layers * self.attention_floor_s + blend(compute, memory, self.ridge)

    @property
    def splits_attention(self) -> bool:
        """Whether decode attention has terms of its own (`decode_attention_s`)."""
        return self.decode_attention_bytes_per_s is not None

    def decode_attention_s(
        self,
        flops,
        nbytes,
        layers: float | np.ndarray = 1.0,
        sequences: float | np.ndarray = 0.0,  # an array of batch sizes when fitting
    ):
        """Decode attention of ``sequences`` sequences over ``layers`` layers: bandwidth-bound,
        at the share of HBM bandwidth decode kernels reach, with their own fixed cost per layer
        and per sequence per layer."""
        assert self.decode_attention_bytes_per_s is not None
        memory = as_float(nbytes) / self.decode_attention_bytes_per_s
        compute = as_float(flops) / self.attention_flops_per_s
        fixed = layers * (
            self.decode_attention_floor_s + sequences * self.decode_attention_per_sequence_s
        )
        return fixed + blend(compute, memory, self.ridge)

    def prefill_flops_at_peak_rate(
        self, pairs: float, per_pair: float, new: int, cached: float = 0.0, q_per_kv: float = 1.0
    ) -> float:
        """A chunk of ``new`` tokens attending ``pairs`` (query, key) pairs of ``per_pair`` FLOPs,
        ``cached`` of them against cached context, as the FLOPs it would take at the efficiency
        long chunks reach. Its causal part (the new tokens among themselves) is the shape the
        ramp was measured on (`attention_ramp_tokens`, fitted to context attention without a
        cached prefix: a short chunk fills few query tiles and SMs). Its part against cached
        context runs as a split-KV kernel that fills the SMs along the context, so it pays only
        for the query tile's idle rows (`query_tile_waste`). Terms without a ramp (one
        efficiency at any length, the fits to 2024's eager kernels) price every pair at that
        efficiency, as they were fitted."""
        if not self.attention_ramp_tokens or new <= 0:
            return pairs * per_pair
        causal = (pairs - cached) * per_pair * (new + self.attention_ramp_tokens) / new
        if cached:
            return causal + cached * per_pair * query_tile_waste(new, q_per_kv)
        return causal

    def mixed_attention_s(
        self, prefill_flops, prefill_bytes, decode_flops, decode_bytes, layers, sequences=0.0
    ):
        """Prefill chunks and decode sequences in one attention kernel per layer (vLLM V1's
        unified call): each part at its own rates, one fixed cost per layer, the larger."""
        memory = as_float(prefill_bytes) / self.bytes_per_s
        compute = as_float(prefill_flops) / self.attention_flops_per_s
        t = blend(compute, memory, self.ridge) + self.decode_attention_s(
            decode_flops, decode_bytes, 0.0
        )
        per_sequence = layers * sequences * self.decode_attention_per_sequence_s
        return (
            layers * max(self.attention_floor_s, self.decode_attention_floor_s) + per_sequence + t
        )

    def elementwise_s(self, nbytes, kernels: float):
        """Memory-bound passes (norms, RoPE, activation, residual adds) of ``kernels`` kernels."""
        moved = as_float(nbytes) / self.elementwise_bytes_per_s
        return kernels * self.elementwise_floor_s + moved

    def allreduce_s(self, nbytes, tp: int):
        """One all-reduce of ``nbytes`` over ``tp`` GPUs."""
        return allreduce_s(self.allreduce, nbytes, tp)

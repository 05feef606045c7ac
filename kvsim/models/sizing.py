"""Exact KV-cache, weight and FLOP sizes of a model, per tensor-parallel rank.

Every function answers for **one rank** of a ``tp``-way tensor-parallel replica; at ``tp=1`` that
is the whole model. The formulas follow vLLM's ``kv_cache_interface`` (one page per layer group)
as summarised in shared/reference/algorithms.md, "KV sizing formulas":

- full / sliding attention: ``block_size × kv_heads_per_rank × (head_dim_k + head_dim_v) × dtype``
  per layer, with ``kv_heads_per_rank = max(1, kv_heads // tp)`` (heads replicated when ``tp``
  exceeds them), plus per-token-head scales for quantised dtypes (see ``kvsim.models.dtypes``);
  ``tp`` must split the heads evenly, as vLLM requires (``check_tp``), so this is exact;
- MLA: ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer, replicated (not
  sharded) on every rank;
- sliding window: at most ``cdiv(min(W − 1 + max_num_batched_tokens, context), block_size) + 1``
  blocks per layer;
- Mamba / linear attention: a fixed state per sequence, sharded over ``tp`` with the inner
  dimension, no per-token KV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.errors import ConfigError, KvsimError
from kvsim.models.dtypes import KvDtype, weight_dtype_bytes
from kvsim.models.dtypes import kv_dtype as resolve_kv_dtype
from kvsim.models.spec import LayerGroup, ModelSpec

__all__ = [
    "AttentionCost",
    "attention_costs",
    "check_tp",
    "kv_bytes_per_block",
    "kv_bytes_per_token",
    "kv_heads_per_rank",
    "linear_flops_per_token",
    "mha_equivalent_bytes_per_token",
    "mla_overprovisioning",
    "sequence_kv_bytes",
    "tp_degrees",
    "weight_bytes",
]


@dataclass(frozen=True)
class AttentionCost:
    """What one layer group costs per rank: the engine's cost model reads only this.

    ``flops_per_token_pair`` is one query token attending to one cached key token in all layers of
    the group: ``QKᵀ`` plus ``PV``, 2 FLOPs per multiply-add. For MLA it is the absorbed-latent
    (decode) form, ``heads × 2 × (2·kv_lora_rank + qk_rope_head_dim)``;
    ``prefill_flops_per_token_pair`` is the uncompressed form
    ``heads × 2 × (qk_nope + qk_rope + v_head_dim)`` that prefill kernels use. For other kinds
    both fields are equal. ``kv_bytes_per_token`` and ``state_bytes_per_seq`` are per rank.
    """

    kind: str
    layers: int
    window: int | None
    kv_bytes_per_token: float
    flops_per_token_pair: float
    prefill_flops_per_token_pair: float
    state_bytes_per_seq: float


def _tp_problem(spec: ModelSpec, tp: int) -> str | None:
    """Why vLLM would refuse ``tp`` for ``spec``, or None.

    vLLM shards attention heads evenly: the query heads must divide by ``tp``; KV heads must
    divide by ``tp`` when there are at least ``tp`` of them, and otherwise ``tp`` must be a
    multiple of them (each KV head then lives whole on ``tp / kv_heads`` ranks). Any other
    degree would leave ranks with fractional heads, which no kernel runs.
    """
    heads = [("num_attention_heads", spec.num_attention_heads)]
    heads += [
        (f"layer group {i} num_heads", g.num_heads)
        for i, g in enumerate(spec.layer_groups)
        if g.kind in ("full", "sliding", "mla")
    ]
    for what, count in heads:
        if count % tp:
            return f"{what} ({count}) is not divisible by tp {tp}"
    for i, g in enumerate(spec.layer_groups):
        if g.kind not in ("full", "sliding"):
            continue
        kv = g.num_kv_heads
        if kv < 1:
            return f"layer group {i} has no KV heads"
        if kv >= tp and kv % tp:
            return f"layer group {i} num_kv_heads ({kv}) is not divisible by tp {tp}"
        if kv < tp and tp % kv:
            return f"tp {tp} is not a multiple of layer group {i} num_kv_heads ({kv})"
    return None


def tp_degrees(spec: ModelSpec) -> list[int]:
    """Every tensor-parallel degree vLLM accepts for ``spec`` (all divide the query heads).

    Candidates are the divisors of the head counts' greatest common divisor, found in
    O(sqrt(heads)) steps: a loop over 1..heads took minutes for a model file claiming 10^8 heads.
    """
    heads = [spec.num_attention_heads]
    heads += [g.num_heads for g in spec.layer_groups if g.kind in ("full", "sliding", "mla")]
    common = math.gcd(*heads)
    small = [d for d in range(1, math.isqrt(common) + 1) if common % d == 0]
    divisors = sorted({*small, *(common // d for d in small)})
    return [tp for tp in divisors if _tp_problem(spec, tp) is None]


def check_tp(spec: ModelSpec, tp: int) -> None:
    """ConfigError naming the model and ``tp`` unless ``tp`` splits the heads as vLLM requires."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"tp: tensor-parallel degree must be an integer ≥ 1, got {tp!r}")
    problem = _tp_problem(spec, tp)
    if problem:
        valid = ", ".join(map(str, tp_degrees(spec)))
        raise ConfigError(
            f"{spec.name}: tp={tp} does not split the attention heads evenly ({problem}), so "
            f"vLLM refuses it; valid tp: {valid}"
        )


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ConfigError(f"block_size: must be an integer ≥ 1, got {block_size!r}")


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads each rank stores: sharded while ``tp ≤ kv_heads``, replicated beyond (vLLM)."""
    return max(1, num_kv_heads // tp)


def _query_heads_per_rank(num_heads: int, tp: int) -> int:
    return max(1, num_heads // tp)


def _group_bytes_per_token(group: LayerGroup, dtype: KvDtype, tp: int) -> float:
    """Bytes one token adds to ``group`` on one rank (all of its KV-storing layers)."""
    if group.kind in ("full", "sliding"):
        if dtype.mla_latent_group is not None:
            raise KvsimError(f"kv dtype {dtype.name!r} applies to MLA models only")
        heads = kv_heads_per_rank(group.num_kv_heads, tp)
        per_head = (group.head_dim_k + group.head_dim_v) * dtype.element_bytes
        per_head += 2 * dtype.scale_bytes  # one scale for K, one for V
        return group.kv_layers * heads * per_head
    if group.kind == "mla":
        if dtype.mla_latent_group is not None:
            scales = math.ceil(group.kv_lora_rank / dtype.mla_latent_group) * dtype.scale_bytes
            rope = group.qk_rope_head_dim * (dtype.mla_rope_bytes or dtype.element_bytes)
            per_layer = group.kv_lora_rank * dtype.element_bytes + scales + rope
        else:
            latent = group.kv_lora_rank + group.qk_rope_head_dim
            per_layer = latent * dtype.element_bytes + dtype.scale_bytes  # one vector, one scale
        return group.kv_layers * per_layer
    return 0.0


def _group_state_bytes(group: LayerGroup, tp: int) -> float:
    """Fixed per-sequence state of a linear/Mamba group on one rank (inner dim sharded by tp)."""
    if group.kind != "linear":
        return 0.0
    return math.ceil(group.state_bytes_per_seq / tp)


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str | KvDtype = "bf16", tp: int = 1) -> int:
    """Bytes one token adds on one rank across every layer that keeps per-token KV.

    Sliding layers count in full: this is the per-token page cost before the window cap.
    Llama-3.1-70B bf16: 80 × 8 × (128 + 128) × 2 = 327,680; DeepSeek-V3: 61 × 576 × 2 = 70,272.
    """
    check_tp(spec, tp)
    dtype = resolve_kv_dtype(kv_dtype)
    return math.ceil(sum(_group_bytes_per_token(g, dtype, tp) for g in spec.layer_groups))


def kv_bytes_per_block(
    spec: ModelSpec, block_size: int = 16, kv_dtype: str | KvDtype = "bf16", tp: int = 1
) -> int:
    """Bytes of one block (``block_size`` tokens) in every KV layer on one rank (vLLM page size)."""
    check_tp(spec, tp)
    _check_block_size(block_size)
    dtype = resolve_kv_dtype(kv_dtype)
    per_token = sum(_group_bytes_per_token(g, dtype, tp) for g in spec.layer_groups)
    return math.ceil(block_size * per_token)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sequence_blocks(group: LayerGroup, context_tokens: int, block_size: int, batched: int) -> int:
    """Blocks per layer one sequence of ``context_tokens`` holds in ``group``.

    Full and MLA layers keep every token. Sliding layers keep at most
    ``cdiv(min(W − 1 + max_num_batched_tokens, context), block_size) + 1`` blocks (vLLM's
    ``SlidingWindowSpec.max_memory_usage_bytes``), and never more than the full count.
    """
    if group.kind not in ("full", "sliding", "mla") or context_tokens <= 0:
        return 0
    full = _cdiv(context_tokens, block_size)
    if group.kind != "sliding" or group.window is None:
        return full
    capped = _cdiv(min(group.window - 1 + batched, context_tokens), block_size) + 1
    return min(full, capped)


def sequence_kv_bytes(
    spec: ModelSpec,
    context_tokens: int,
    kv_dtype: str | KvDtype = "bf16",
    tp: int = 1,
    block_size: int = 16,
    max_num_batched_tokens: int = 1,
) -> int:
    """Exact bytes one sequence of ``context_tokens`` holds on one rank, in whole blocks.

    Full/MLA layers: every token, rounded up to blocks. Sliding layers: capped by the window
    (see ``sequence_blocks``). Linear/Mamba layers: their fixed state.
    ``max_num_batched_tokens`` is what the sequence may add in one step: 1 is steady-state
    decode; pass the engine's prefill chunk size for vLLM's worst case during chunked prefill.
    """
    check_tp(spec, tp)
    _check_block_size(block_size)
    if context_tokens < 0:
        raise ConfigError(f"context_tokens: must be ≥ 0, got {context_tokens}")
    dtype = resolve_kv_dtype(kv_dtype)
    total = 0.0
    for group in spec.layer_groups:
        blocks = sequence_blocks(group, context_tokens, block_size, max(1, max_num_batched_tokens))
        total += blocks * block_size * _group_bytes_per_token(group, dtype, tp)
        total += _group_state_bytes(group, tp)
    return math.ceil(total)


def mha_equivalent_bytes_per_token(
    spec: ModelSpec, kv_dtype: str | KvDtype = "bf16", tp: int = 1
) -> int:
    """Bytes per token if MLA layers were sized as plain MHA (what generic frameworks reserve).

    Each MLA layer counts ``num_heads`` K heads of ``qk_nope_head_dim`` and V heads of
    ``v_head_dim`` (DeepSeek-V3: 2 × 128 × 128 = 32,768 elements against 576), heads sharded
    over ``tp`` like MHA. Other groups keep their exact size.
    """
    check_tp(spec, tp)
    dtype = resolve_kv_dtype(kv_dtype)
    if dtype.mla_latent_group is not None:  # the MHA stand-in has no latent to quantise that way
        dtype = KvDtype(dtype.name, dtype.element_bytes, dtype.scale_bytes)
    total = 0.0
    for group in spec.layer_groups:
        if group.kind == "mla":
            heads = _query_heads_per_rank(group.num_heads, tp)
            per_head = (group.qk_nope_head_dim + group.v_head_dim) * dtype.element_bytes
            total += group.kv_layers * heads * (per_head + 2 * dtype.scale_bytes)
        else:
            total += _group_bytes_per_token(group, dtype, tp)
    return math.ceil(total)


def mla_overprovisioning(spec: ModelSpec, kv_dtype: str | KvDtype = "bf16") -> float:
    """MHA-equivalent over exact bytes per token at tp=1: 56.9 for DeepSeek-V3; 1.0 without MLA."""
    if not spec.is_mla:
        return 1.0
    exact = kv_bytes_per_token(spec, kv_dtype)
    return mha_equivalent_bytes_per_token(spec, kv_dtype) / exact


def weight_bytes(spec: ModelSpec, weight_dtype: str = "bf16", tp: int = 1) -> int:
    """Weight bytes per rank: all parameters (embeddings too) split evenly over ``tp``."""
    check_tp(spec, tp)
    return math.ceil(spec.num_params * weight_dtype_bytes(weight_dtype) / tp)


def linear_flops_per_token(spec: ModelSpec, tp: int = 1) -> float:
    """Matmul FLOPs per token per rank: 2 × active parameters, less the embedding lookup.

    The LM head is a matmul and counts; with tied embeddings the one matrix is the LM head.
    Norms and routers are included (negligible). Attention over the context is separate
    (``attention_costs``).
    """
    check_tp(spec, tp)
    lookup = 0 if spec.tie_word_embeddings else spec.embedding_params
    return 2.0 * (spec.active_params - lookup) / tp


def attention_costs(
    spec: ModelSpec, kv_dtype: str | KvDtype = "bf16", tp: int = 1
) -> list[AttentionCost]:
    """One ``AttentionCost`` per layer group that stores KV, keeps state or attends."""
    check_tp(spec, tp)
    dtype = resolve_kv_dtype(kv_dtype)
    costs: list[AttentionCost] = []
    for group in spec.layer_groups:
        if group.kind == "none":
            continue
        if group.kind in ("full", "sliding"):
            heads = _query_heads_per_rank(group.num_heads, tp)
            decode = prefill = group.layers * heads * 2.0 * (group.head_dim_k + group.head_dim_v)
        elif group.kind == "mla":
            heads = _query_heads_per_rank(group.num_heads, tp)
            absorbed = 2 * group.kv_lora_rank + group.qk_rope_head_dim
            plain = group.qk_nope_head_dim + group.qk_rope_head_dim + group.v_head_dim
            decode = group.layers * heads * 2.0 * absorbed
            prefill = group.layers * heads * 2.0 * plain
        else:
            decode = prefill = 0.0
        costs.append(
            AttentionCost(
                kind=group.kind,
                layers=group.layers,
                window=group.window if group.kind == "sliding" else None,
                kv_bytes_per_token=_group_bytes_per_token(group, dtype, tp),
                flops_per_token_pair=decode,
                prefill_flops_per_token_pair=prefill,
                state_bytes_per_seq=_group_state_bytes(group, tp),
            )
        )
    return costs

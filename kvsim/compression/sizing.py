"""Exact KV bytes after compression, and the extra work each profile adds, per tensor-parallel rank.

Bytes, per KV layer ``l`` (layers numbered in layer-group order, each group's KV-storing layers
in turn, as ``LayerGroup.kv_layers`` counts them):

    kept_l × token_bytes_l  (+ residual tokens at the base width, quant only)

- full / sliding attention: ``token_bytes = kv_heads_per_rank × (vec(head_dim_k, kbits) +
  vec(head_dim_v, vbits))`` with ``vec(d, b) = d·b/8 + ceil(d/group) × 4`` for ``b < 16`` (an fp16
  scale and an fp16 zero-point per group of ``group`` elements along the head dim, KIVI's
  asymmetric layout, arXiv 2402.02750) and ``vec(d, 16) = 2·d`` (plain 16-bit, no scales);
- MLA: the latent (``kv_lora_rank + qk_rope_head_dim`` elements, replicated on every rank) is one
  vector that serves as both K and V, so it is quantised as one vector at ``max(kbits, vbits)``;
  token dropping removes a token's latent as it removes its K and V elsewhere;
- sliding layers: token dropping applies to them as to full layers, and, like
  ``kvsim.models.kv_bytes_per_token``, they count every kept token (the engine's page cost);
  ``window_cap=True`` caps each sliding layer at its window instead;
- linear / Mamba layers keep no per-token KV: compression leaves their fixed state alone and
  these functions leave it out (``kvsim.models.sequence_kv_bytes`` adds it).

A quantised layout that would cost more than the base KV dtype (16-bit into an fp8 cache, or tiny
groups) is not used: the layer keeps the base width, so compression never raises memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from kvsim.compression.base import Compression
from kvsim.errors import ConfigError
from kvsim.models.dtypes import KvDtype
from kvsim.models.sizing import attention_costs, kv_bytes_per_token, kv_heads_per_rank
from kvsim.models.spec import LayerGroup, ModelSpec

__all__ = [
    "SCALE_BYTES_PER_GROUP",
    "CompressionWork",
    "LayerBytes",
    "bytes_per_kept_token",
    "compressed_kv_bytes",
    "compression_work",
    "host_kv_bytes",
    "kv_layer_count",
    "layer_bytes",
]

#: One fp16 scale plus one fp16 zero-point per quantisation group (KIVI stores both in fp16).
SCALE_BYTES_PER_GROUP = 4


@dataclass(frozen=True)
class LayerBytes:
    """One KV layer on one rank: its shape and a token's bytes there, base and compressed."""

    group: LayerGroup
    heads: int  # KV heads on this rank (1 for an MLA latent)
    base_bytes: float  # one token at the base KV dtype, scales included
    token_bytes: float  # one kept token after compression (≤ base_bytes)
    quantised: bool


def kv_layer_count(spec: ModelSpec) -> int:
    """KV-storing layers of ``spec``: the layer indices per-layer profiles answer for.

    Linear/Mamba and attention-free layers hold no per-token KV, and layers that reuse a
    neighbour's KV (``kv_sharing_factor``) are not counted, so this can be below ``num_layers``
    (jamba-v0.1: 4 of 32).
    """
    return sum(g.kv_layers for g in spec.layer_groups)


def _vector_bytes(elements: int, bits: int, group: int) -> float:
    if bits >= 16:
        return 2.0 * elements
    return elements * bits / 8 + math.ceil(elements / group) * SCALE_BYTES_PER_GROUP


def layer_bytes(
    spec: ModelSpec, comp: Compression, kv_dtype: str | KvDtype = "bf16", tp: int = 1
) -> list[LayerBytes]:
    """Every KV-storing layer of ``spec`` on one rank, with its compressed bytes per token.

    ConfigError when a per-layer profile (lkv list, moe-nd) lists another number of layers.
    """
    groups = [g for g in spec.layer_groups if g.kind != "none"]
    costs = attention_costs(spec, kv_dtype, tp)  # checks tp and the dtype
    layers: list[LayerBytes] = []
    for group, cost in zip(groups, costs, strict=True):
        if group.kind not in ("full", "sliding", "mla"):
            continue
        base = cost.kv_bytes_per_token / group.kv_layers
        heads = 1 if group.kind == "mla" else kv_heads_per_rank(group.num_kv_heads, tp)
        for _ in range(group.kv_layers):
            layers.append(LayerBytes(group, heads, base, base, False))
    expected = comp.layer_count
    if expected is not None and expected != len(layers):
        raise ConfigError(
            f"compression {comp.name}: {expected} per-layer entries, but {spec.name} has "
            f"{len(layers)} KV layers (layers that store KV); {comp.layer_count_hint(len(layers))}"
        )
    out: list[LayerBytes] = []
    for index, lb in enumerate(layers):
        bits = comp.layer_bits(index)
        if bits is None:
            out.append(lb)
            continue
        kbits, vbits, group_size = bits
        g = lb.group
        if g.kind == "mla":
            latent = g.kv_lora_rank + g.qk_rope_head_dim
            packed = _vector_bytes(latent, max(kbits, vbits), group_size)
        else:
            packed = lb.heads * (
                _vector_bytes(g.head_dim_k, kbits, group_size)
                + _vector_bytes(g.head_dim_v, vbits, group_size)
            )
        quantised = packed < lb.base_bytes
        out.append(LayerBytes(g, lb.heads, lb.base_bytes, min(packed, lb.base_bytes), quantised))
    return out


@dataclass(frozen=True)
class _LayerClass:
    """Layers that keep the same tokens: one ``kept_tokens`` call serves them all."""

    layer: int  # a representative KV layer index
    window: int | None  # sliding window to cap at (window_cap only)
    token_bytes: Fraction | int  # Σ bytes per kept token over the class's layers
    residual_extra: Fraction | int  # Σ (base − token) bytes over its quantised layers


_PLANS: dict[tuple[object, ...], tuple[ModelSpec, Compression, tuple[_LayerClass, ...]]] = {}


def _plan(
    spec: ModelSpec, comp: Compression, kv_dtype: str | KvDtype, tp: int, window_cap: bool
) -> tuple[_LayerClass, ...]:
    """The layer classes of ``_build_plan``, memoised by object identity.

    The engine asks about the same spec and profile at many contexts; hashing a ModelSpec and a
    32-layer profile on every call cost more than the arithmetic. The memo holds the objects
    themselves, so an id is never reused while its entry lives.
    """
    key = (id(spec), id(comp), kv_dtype, tp, window_cap)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is spec and hit[1] is comp:
        return hit[2]
    plan = _build_plan(spec, comp, kv_dtype, tp, window_cap)
    if len(_PLANS) >= 256:
        _PLANS.clear()
    _PLANS[key] = (spec, comp, plan)
    return plan


def _build_plan(
    spec: ModelSpec, comp: Compression, kv_dtype: str | KvDtype, tp: int, window_cap: bool
) -> tuple[_LayerClass, ...]:
    """Layers grouped by what they keep, with exact byte sums."""
    classes: dict[tuple[object, int | None], list] = {}
    per_layer = comp.layer_count is not None
    for index, lb in enumerate(layer_bytes(spec, comp, kv_dtype, tp)):
        window = lb.group.window if window_cap and lb.group.kind == "sliding" else None
        key = (comp.keep_ratio(index) if per_layer else None, window)
        entry = classes.setdefault(key, [index, Fraction(0), Fraction(0)])
        entry[1] += Fraction(comp.gpu_token_bytes(lb))
        if lb.quantised:
            entry[2] += Fraction(lb.base_bytes) - Fraction(lb.token_bytes)
    return tuple(
        _LayerClass(layer, window, _exact(tok), _exact(extra))
        for (_, window), (layer, tok, extra) in classes.items()
    )


def _exact(value: Fraction) -> Fraction | int:
    """An int where the sum is whole (the usual case): int arithmetic is far faster."""
    return value.numerator if value.denominator == 1 else value


def compressed_kv_bytes(
    spec: ModelSpec,
    comp: Compression,
    context_tokens: int,
    kv_dtype: str | KvDtype = "bf16",
    tp: int = 1,
    generated_tokens: int = 0,
    window_cap: bool = False,
) -> int:
    """Exact bytes of one sequence's KV on one rank after compression: all layers, scales included.

    ``none`` (``identity``) gives ``context_tokens × kv_bytes_per_token`` exactly. Quant's most
    recent ``residual`` tokens per layer stay at the base width (KIVI's full-precision residual).
    An offloaded profile (infinigen) counts only what stays on the GPU (its partial keys);
    ``host_kv_bytes`` has the offloaded rest. A per-request choice (``auto``) answers for its
    largest candidate (a reservation bound).
    """
    if comp.identity:
        if context_tokens < 0:
            raise ConfigError(f"context_tokens: must be ≥ 0, got {context_tokens}")
        return context_tokens * kv_bytes_per_token(spec, kv_dtype, tp)
    if comp.per_request_choice:
        return max(
            compressed_kv_bytes(spec, c, context_tokens, kv_dtype, tp, generated_tokens, window_cap)
            for c in comp.candidates
        )
    residual = comp.residual_tokens()
    total: Fraction | int = 0
    for cls in _plan(spec, comp, kv_dtype, tp, window_cap):
        kept = comp.kept_tokens(context_tokens, cls.layer, generated_tokens)
        if cls.window is not None:
            kept = min(kept, cls.window)
        total += kept * cls.token_bytes
        if residual and cls.residual_extra:
            total += min(kept, residual) * cls.residual_extra
    return math.ceil(total)


def bytes_per_kept_token(
    spec: ModelSpec, comp: Compression, kv_dtype: str | KvDtype = "bf16", tp: int = 1
) -> float:
    """Bytes one kept token costs across all KV layers on one rank: the engine's page cost.

    It is ``Σ_l w_l × token_bytes_l`` with ``w_l = keep_l / mean keep`` (every ``w_l`` is 1 when
    all layers keep the same tokens), so ``kept_tokens(n) × bytes_per_kept_token`` matches
    ``compressed_kv_bytes`` up to rounding, except that quant's unquantised residual tokens are
    left out (they add ``min(n, residual) × (base − token bytes)`` per layer; use
    ``compressed_kv_bytes`` for the exact figure). Infinigen: its partial key per token.
    """
    if comp.identity:
        return float(kv_bytes_per_token(spec, kv_dtype, tp))
    if comp.per_request_choice:
        return max(bytes_per_kept_token(spec, c, kv_dtype, tp) for c in comp.candidates)
    layers = layer_bytes(spec, comp, kv_dtype, tp)
    if comp.layer_count is None:
        return float(sum(comp.gpu_token_bytes(lb) for lb in layers))
    # exact arithmetic, so the weighted mean of equal widths is that width, not one ulp above
    keeps = [comp.keep_ratio(i) for i in range(len(layers))]
    total = sum(
        (k * Fraction(comp.gpu_token_bytes(lb)) for k, lb in zip(keeps, layers, strict=True)),
        Fraction(0),
    )
    return float(total * len(keeps) / sum(keeps, Fraction(0)))


def host_kv_bytes(
    spec: ModelSpec,
    comp: Compression,
    context_tokens: int,
    kv_dtype: str | KvDtype = "bf16",
    tp: int = 1,
) -> int:
    """Bytes of one sequence's KV that live in CPU DRAM: infinigen's full KV, else 0."""
    if not comp.offloaded:
        return 0
    if context_tokens < 0:
        raise ConfigError(f"context_tokens: must be ≥ 0, got {context_tokens}")
    return context_tokens * kv_bytes_per_token(spec, kv_dtype, tp)


@dataclass(frozen=True)
class CompressionWork:
    """Extra work a profile adds, per rank, summed over KV layers, for the cost model to price.

    Units and when each applies:

    - ``score_flops_per_prompt_token``: FLOPs once after prefill, per prompt token. SnapKV: its
      ``window`` observation queries score every prompt key, ``Σ_l q_heads × 2 × w × head_dim_k``.
    - ``select_items_per_prompt_token``: top-k inputs once after prefill, per prompt token: one
      score per KV head per layer (SnapKV, LKV, MoE-nD layers with keep < 1).
    - ``score_flops_per_read_token``: FLOPs per decode step per token read. H2O accumulates each
      token's attention probability per query head: ``Σ_l q_heads`` (1 add; our assumption that
      the kernel emits the probabilities).
    - ``select_items_per_read_token``: per decode step per token read: H2O picks the lowest
      accumulated score per KV head to evict, ``Σ_l kv_heads``.
    - ``speculate_flops_per_context_token``: FLOPs per decode step per context token: InfiniGen's
      partial query-key product, ``Σ_l q_heads × 2 × ceil(partial × head_dim_k)``.
    - ``select_items_per_context_token``: per decode step per context token: InfiniGen's top-k
      over the speculated scores, one per query head per layer.
    - ``quant_bytes_per_token``: HBM bytes read and written to quantise one new token's KV:
      its base-width K and V read plus its packed K, V, scales and zero-points written.
    - ``dequant_flops_per_read_token``: per decode step per token read: a multiply by the scale
      and an add of the zero-point per element, ``Σ_l kv_heads × (d_k + d_v) × 2``.
    - ``dequant_bytes_per_read_token``: 0: KIVI fuses dequantisation into the attention matmul,
      so attention reads only the packed bytes (``kv_read_bytes_per_read_token``).
    - ``kv_read_bytes_per_read_token``: HBM bytes attention reads per token it reads, all layers:
      the compressed width, or for infinigen the full width of the fetched copy.
    - ``host_bytes_per_read_token``: bytes over the host link per token read per decode step
      (infinigen fetches each selected token's full K and V of every layer).
    - ``host_bytes_per_new_token``: bytes written to CPU DRAM per new token (infinigen).
    - ``notes``: work the profile does that no published figure lets us price (left at 0).
    """

    score_flops_per_prompt_token: float = 0.0
    select_items_per_prompt_token: float = 0.0
    score_flops_per_read_token: float = 0.0
    select_items_per_read_token: float = 0.0
    speculate_flops_per_context_token: float = 0.0
    select_items_per_context_token: float = 0.0
    quant_bytes_per_token: float = 0.0
    dequant_flops_per_read_token: float = 0.0
    dequant_bytes_per_read_token: float = 0.0
    kv_read_bytes_per_read_token: float = 0.0
    host_bytes_per_read_token: float = 0.0
    host_bytes_per_new_token: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


def _q_heads(group: LayerGroup, tp: int) -> int:
    return max(1, group.num_heads // tp)


def compression_work(
    spec: ModelSpec, comp: Compression, kv_dtype: str | KvDtype = "bf16", tp: int = 1
) -> CompressionWork:
    """The work ``comp`` adds to serving ``spec`` on one rank (see ``CompressionWork``): the
    profile's own (``add_layer_work``), quantising and dequantising wherever ``layer_bits``
    narrows a layer, and an offloaded profile's host-link traffic (it reads full-width tokens
    fetched from CPU DRAM)."""
    if comp.per_request_choice:
        raise ConfigError(
            f"compression {comp.name}: choose a candidate first (kvsim.compression.choose)"
        )
    layers = layer_bytes(spec, comp, kv_dtype, tp)
    base_total = sum(lb.base_bytes for lb in layers)
    read_bytes = base_total if comp.offloaded else bytes_per_kept_token(spec, comp, kv_dtype, tp)
    work: dict[str, float] = {"kv_read_bytes_per_read_token": read_bytes}

    def add(key: str, value: float) -> None:
        work[key] = work.get(key, 0.0) + value

    for index, lb in enumerate(layers):
        g = lb.group
        q_heads = _q_heads(g, tp)
        key_dims = g.kv_lora_rank + g.qk_rope_head_dim if g.kind == "mla" else g.head_dim_k
        comp.add_layer_work(add, index, lb, q_heads, key_dims)
        if lb.quantised:
            elements = (
                g.kv_lora_rank + g.qk_rope_head_dim
                if g.kind == "mla"
                else lb.heads * (g.head_dim_k + g.head_dim_v)
            )
            add("quant_bytes_per_token", lb.base_bytes + lb.token_bytes)
            add("dequant_flops_per_read_token", 2.0 * elements)
    if comp.offloaded:  # every token read is fetched, every new one written back
        work["host_bytes_per_read_token"] = base_total
        work["host_bytes_per_new_token"] = base_total
    return CompressionWork(**work, notes=comp.work_notes)

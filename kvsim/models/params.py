"""Parameter counts from config shapes, so weight bytes and linear FLOPs need no extra data.

Counted: input embedding, LM head (unless tied), attention projections (with MLA's low-rank
query and KV projections and their norms), Mamba mixers, gated MLPs and MoE experts (routed,
shared, router), and RMSNorm weights (``norms_per_layer`` per layer plus the final norm).
Not counted: DeepSeek-V3's multi-token-prediction module (the published 671 B excludes it) and
router bias vectors (a few hundred parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.models.spec import LayerGroup, MlpGroup, ModelSpec


@dataclass(frozen=True)
class ParamCount:
    """Total parameters, and those one token actually multiplies (routed experts: top-k only)."""

    total: int
    active: int


def attention_params_per_layer(group: LayerGroup, hidden: int) -> int:
    """Projection weights of one layer in ``group``, K/V aside (shared-KV layers have none)."""
    if group.kind in ("full", "sliding"):
        q = hidden * group.num_heads * group.head_dim_k
        o = group.num_heads * group.head_dim_v * hidden
        bias = group.num_heads * group.head_dim_k if group.attention_bias else 0
        return q + o + bias
    if group.kind == "mla":
        qk_head = group.qk_nope_head_dim + group.qk_rope_head_dim
        if group.q_lora_rank:
            q = (
                hidden * group.q_lora_rank
                + group.q_lora_rank
                + group.q_lora_rank * (group.num_heads * qk_head)
            )
        else:
            q = hidden * group.num_heads * qk_head
        kv_a = hidden * (group.kv_lora_rank + group.qk_rope_head_dim) + group.kv_lora_rank
        kv_b = group.kv_lora_rank * group.num_heads * (group.qk_nope_head_dim + group.v_head_dim)
        o = group.num_heads * group.v_head_dim * hidden
        return q + kv_a + kv_b + o
    if group.kind == "linear":
        return group.mixer_params_per_layer or mamba_params_per_layer(group, hidden)
    return 0


def kv_projection_params_per_layer(group: LayerGroup, hidden: int) -> int:
    """K and V projections of a full/sliding layer (absent on layers that reuse shared KV)."""
    if group.kind not in ("full", "sliding"):
        return 0
    kv_width = group.num_kv_heads * (group.head_dim_k + group.head_dim_v)
    return hidden * kv_width + (kv_width if group.attention_bias else 0)


def mamba_params_per_layer(group: LayerGroup, hidden: int) -> int:
    """Mamba-1 mixer as in Jamba: in/out projections, depthwise conv, x/dt projections, A, D.

    Jamba also norms dt, B and C (``dt_rank + 2 × d_state`` weights); included here.
    """
    d_inner, d_state, dt_rank = group.mamba_d_inner, group.mamba_d_state, group.mamba_dt_rank
    in_proj = hidden * 2 * d_inner
    conv = d_inner * group.mamba_d_conv + d_inner
    x_proj = d_inner * (dt_rank + 2 * d_state)
    dt_proj = dt_rank * d_inner + d_inner
    a_and_d = d_inner * d_state + d_inner
    out_proj = d_inner * hidden
    inner_norms = dt_rank + 2 * d_state
    return in_proj + conv + x_proj + dt_proj + a_and_d + out_proj + inner_norms


def mlp_params_per_layer(group: MlpGroup, hidden: int) -> ParamCount:
    """Gated MLP: three hidden × intermediate matrices per expert; router for MoE."""
    per_expert = 3 * hidden * group.intermediate_size
    if not group.is_moe:
        return ParamCount(per_expert, per_expert)
    shared_inter = group.shared_intermediate_size or group.intermediate_size
    shared = group.num_shared_experts * 3 * hidden * shared_inter
    router = hidden * group.num_experts
    total = group.num_experts * per_expert + shared + router
    active = group.experts_per_token * per_expert + shared + router
    return ParamCount(total, active)


def count_params(spec: ModelSpec) -> ParamCount:
    """Total and per-token-active parameters of ``spec`` (embedding and LM head included)."""
    hidden = spec.hidden_size
    embeddings = spec.embedding_params * (1 if spec.tie_word_embeddings else 2)
    norms = spec.num_layers * spec.norms_per_layer * hidden + hidden
    dense = embeddings + norms
    for group in spec.layer_groups:
        dense += group.layers * attention_params_per_layer(group, hidden)
        kv_layers = -(-group.layers // group.kv_sharing_factor)
        dense += kv_layers * kv_projection_params_per_layer(group, hidden)
    total = active = dense
    for mlp in spec.mlp_groups:
        count = mlp_params_per_layer(mlp, hidden)
        total += mlp.layers * count.total
        active += mlp.layers * count.active
    return ParamCount(total, active)

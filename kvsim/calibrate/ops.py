"""The operations of a decoder layer in plain PyTorch, shared by microbenchmarks and the forward.

Timing one kernel family in isolation and then predicting a whole forward pass only works if
both run the same code, so the microbenchmarks call these functions and so does
``kvsim.calibrate.decoder``. Weights are random: a GEMM or an attention kernel takes the same
time whatever the values (they are scaled small so no NaN or denormal slows the CPU down).
Only torch is imported here, and only ``kvsim.calibrate`` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvsim.models import ModelSpec, kv_heads_per_rank

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class AttnShape:
    """Per-rank attention shape of the model's attention layers."""

    kind: str  # "full", "sliding" or "mla"
    heads: int
    kv_heads: int
    head_dim: int  # query/key width per head (MLA prefill: nope + rope)
    v_dim: int
    window: int
    latent: int = 0  # MLA: kv_lora_rank
    rope: int = 0  # MLA: qk_rope_head_dim

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.head_dim + self.v_dim)


def attn_shape(model: ModelSpec, tp: int) -> AttnShape:
    """The shape of ``model``'s (single) attention group on one of ``tp`` ranks."""
    g = model.layer_groups[0]
    heads = max(1, g.num_heads // tp)
    if g.kind == "mla":
        qk = g.qk_nope_head_dim + g.qk_rope_head_dim
        return AttnShape(
            "mla", heads, heads, qk, g.v_head_dim, 0, g.kv_lora_rank, g.qk_rope_head_dim
        )
    return AttnShape(
        g.kind,
        heads,
        kv_heads_per_rank(g.num_kv_heads, tp),
        g.head_dim_k,
        g.head_dim_v,
        int(g.window or 0),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm as in Llama/Qwen: scale by the root mean square, then by a learned weight."""
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (tokens, heads, dim) with per-token (tokens, 1, dim/2) angles."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_tables(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for ``positions`` (tokens,), shaped (tokens, 1, dim/2)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=positions.device) / dim))
    angles = positions.float()[:, None] * inv[None, :]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, causal: bool
) -> torch.Tensor:
    """SDPA of q (b, h, n, d) over k/v (b, kvh, context + n, d): causal from the bottom right
    when the chunk follows a cached prefix, as prefix caching needs; GQA by head groups."""
    gqa = q.shape[1] != k.shape[1]
    if causal and context > 0:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q.shape[2], k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def randn(shape: tuple[int, ...], dtype: torch.dtype, device: Any, scale: float = 0.02):
    """Small random values, created on the device (no host copy of large weights)."""
    return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, scale)


class LayerWeights:
    """Random weights of one decoder layer, in the layout F.linear expects (out, in)."""

    def __init__(self, model: ModelSpec, shape: AttnShape, tp: int, dtype, device) -> None:
        hidden = model.hidden_size
        inter = max(1, model.mlp_groups[0].intermediate_size // tp)
        g = model.layer_groups[0]
        self.norm1 = torch.ones(hidden, dtype=dtype, device=device)
        self.norm2 = torch.ones(hidden, dtype=dtype, device=device)
        if shape.kind == "mla":
            self.qkv = randn((shape.q_width + shape.latent + shape.rope, hidden), dtype, device)
            self.kv_b = randn(
                (shape.heads * (shape.head_dim - shape.rope + shape.v_dim), shape.latent),
                dtype,
                device,
            )
        else:
            self.qkv = randn((shape.q_width + shape.kv_width, hidden), dtype, device)
        self.qkv_bias = randn((self.qkv.shape[0],), dtype, device) if g.attention_bias else None
        self.o = randn((hidden, shape.heads * shape.v_dim), dtype, device)
        self.gate_up = randn((2 * inter, hidden), dtype, device)
        self.down = randn((hidden, inter), dtype, device)


def split_qkv(qkv: torch.Tensor, shape: AttnShape) -> tuple[torch.Tensor, ...]:
    """q (T, H, d), k (T, KVH, d), v (T, KVH, dv) views of a fused QKV projection."""
    t = qkv.shape[0]
    kw = shape.kv_heads * shape.head_dim
    q = qkv[:, : shape.q_width].view(t, shape.heads, shape.head_dim)
    k = qkv[:, shape.q_width : shape.q_width + kw].view(t, shape.kv_heads, shape.head_dim)
    v = qkv[:, shape.q_width + kw :].view(t, shape.kv_heads, shape.v_dim)
    return q, k, v


def rope_qkv(qkv: torch.Tensor, cos, sin, shape: AttnShape) -> tuple[torch.Tensor, ...]:
    """Split the fused projection and rotate q and k (v passes through). MLA: rotate the
    queries' rope part and the shared rope key; the latent passes through (cos/sin of
    ``shape.rope`` wide rotations there)."""
    if shape.kind == "mla":
        t, nope = qkv.shape[0], shape.head_dim - shape.rope
        q = qkv[:, : shape.q_width].view(t, shape.heads, shape.head_dim)
        latent = qkv[:, shape.q_width : shape.q_width + shape.latent]
        k_rope = qkv[:, shape.q_width + shape.latent :].view(t, 1, shape.rope)
        q = torch.cat((q[..., :nope], rope(q[..., nope:], cos, sin)), dim=-1)
        return q, rope(k_rope, cos, sin), latent
    q, k, v = split_qkv(qkv, shape)
    return rope(q, cos, sin), rope(k, cos, sin), v


def residual_norm(x: torch.Tensor, y: torch.Tensor, w: LayerWeights):
    """Residual add after attention, then the MLP's RMSNorm."""
    x = x + y
    return x, rms_norm(x, w.norm2)


def gated_silu(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: silu(gate) * up over the fused gate/up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def elementwise_pieces(x, y, qkv, gate_up, w, cos, sin, shape) -> list[tuple[Any, tuple]]:
    """One layer's work outside GEMMs and attention, as the forward runs it: (call, inputs)
    for each piece between two GEMM or attention calls."""
    return [
        (lambda: rms_norm(x, w.norm1), (x,)),
        (lambda: rope_qkv(qkv, cos, sin, shape), (qkv,)),
        (lambda: residual_norm(x, y, w), (x, y)),
        (lambda: gated_silu(gate_up), (gate_up,)),
        (lambda: x + y, (x, y)),
    ]


def prefill_chunk(q, k, v, kc, vc, context: int) -> torch.Tensor:
    """Attention of one prefill chunk: write its K/V after the cached prefix in ``kc``/``vc``
    (1, KVH, context + new, d), attend causally, return (new, H * dv)."""
    new = q.shape[0]
    kc[0, :, context : context + new] = k.transpose(0, 1)
    vc[0, :, context : context + new] = v.transpose(0, 1)
    out = attention(q.transpose(0, 1)[None], kc, vc, context, causal=True)
    return out[0].transpose(0, 1).reshape(new, -1)


def decode_batch(q, k, v, kc, vc, context: int) -> torch.Tensor:
    """Attention of ``B`` decoding sequences at one context: write each new K/V at position
    ``context`` of ``kc``/``vc`` (B, KVH, context + 1, d), attend, return (B, H * dv).

    The query heads that share a KV head are folded into the query length (B, KVH, group, d),
    as GPU decode kernels do: one pass over each KV head instead of a one-row query per head.
    On a CPU the one-row form takes a kernel path whose cost per key wanders by 2.5x with batch
    and context (measured: 1.5-3.7 us per key for qwen2.5-0.5b), which no interpolation over a
    grid can follow; the folded form is 10-15x faster and smooth.
    """
    b = q.shape[0]
    kc[:, :, context] = k
    vc[:, :, context] = v
    kvh = kc.shape[1]
    grouped = q.reshape(b, kvh, q.shape[1] // kvh, q.shape[2])
    out = F.scaled_dot_product_attention(grouped, kc, vc)
    return out.reshape(b, -1)


def mla_decode(q_latent, latent_cache, latent: int) -> torch.Tensor:
    """MLA decode in absorbed form: every head attends the one shared latent (MQA-like), so the
    heads fold into the query length as in ``decode_batch``; q (B, H, 1, latent + rope), cache
    (B, 1, C, latent + rope), values the latent part; returns (B, H, 1, latent)."""
    folded = q_latent.transpose(1, 2)  # (B, 1, H, width)
    out = F.scaled_dot_product_attention(folded, latent_cache, latent_cache[..., :latent])
    return out.transpose(1, 2)

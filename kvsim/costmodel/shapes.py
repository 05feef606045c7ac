"""The shapes of a model's forward pass that calibration measures and measured tables describe.

Calibration times exactly these GEMMs and elementwise passes, and the measured cost model applies
only to models these shapes describe (``supported``); the roofline needs none of this.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.models import ModelSpec, kv_heads_per_rank
from kvsim.models.dtypes import weight_dtype_bytes


@dataclass(frozen=True)
class GemmShape:
    """A weight matrix the forward pass multiplies by: ``k`` in, ``n`` out, ``calls`` times."""

    k: int
    n: int
    calls: int
    per: str = "token"
    bias: bool = False


def supported(model: ModelSpec) -> str | None:
    """Why the measured model cannot describe ``model`` (None when it can)."""
    kinds = {g.kind for g in model.layer_groups}
    if kinds - {"full", "sliding", "mla"}:
        return f"{model.name}: layer kinds {sorted(kinds - {'full', 'sliding', 'mla'})}"
    if any(m.is_moe for m in model.mlp_groups):
        return f"{model.name}: mixture-of-experts MLP"
    if len({(g.kind, g.num_heads, g.num_kv_heads, g.head_dim_k) for g in model.layer_groups}) > 1:
        return f"{model.name}: more than one attention shape"
    return None


def gemm_shapes(model: ModelSpec, tp: int = 1) -> dict[str, GemmShape]:
    """The GEMMs of one forward pass per rank, by role; same-sized roles are merged."""
    hidden = model.hidden_size
    shapes: dict[str, GemmShape] = {}

    def add(name: str, k: int, n: int, calls: int, per: str = "token", bias: bool = False):
        old = shapes.get(name)
        if old is not None and (old.k, old.n) == (k, n):
            shapes[name] = GemmShape(k, n, old.calls + calls, per, bias)
            return
        if old is not None:
            name = f"{name}_{k}x{n}"
        shapes[name] = GemmShape(k, n, calls, per, bias)

    for g in model.layer_groups:
        heads = max(1, g.num_heads // tp)
        if g.kind in ("full", "sliding"):
            kvh = kv_heads_per_rank(g.num_kv_heads, tp)
            add(
                "qkv",
                hidden,
                heads * g.head_dim_k + kvh * (g.head_dim_k + g.head_dim_v),
                g.layers,
                bias=g.attention_bias,
            )
            add("o", heads * g.head_dim_v, hidden, g.layers)
        elif g.kind == "mla":
            qk = g.qk_nope_head_dim + g.qk_rope_head_dim
            if g.q_lora_rank:
                add("q_a", hidden, g.q_lora_rank, g.layers)
                add("q_b", g.q_lora_rank, heads * qk, g.layers)
            else:
                add("q", hidden, heads * qk, g.layers)
            add("kv_a", hidden, g.kv_lora_rank + g.qk_rope_head_dim, g.layers)
            add("kv_b", g.kv_lora_rank, heads * (g.qk_nope_head_dim + g.v_head_dim), g.layers)
            add("o", heads * g.v_head_dim, hidden, g.layers)
    for m in model.mlp_groups:
        inter = max(1, m.intermediate_size // tp)
        add("gate_up", hidden, 2 * inter, m.layers)
        add("down", inter, hidden, m.layers)
    add("lm_head", hidden, max(1, model.vocab_size // tp), 1, per="sequence")
    return shapes


def elementwise_bytes_per_token(model: ModelSpec, tp: int, dtype: str) -> float:
    """Bytes one token moves per layer outside GEMMs and attention (norms, RoPE, SiLU, adds).

    Two RMSNorms (read + write hidden), two residual adds (read two, write one), RoPE on the
    query and key heads (read + write), the gated activation (read two, write one), and the
    KV-cache write. Calibration scales a proxy's elementwise times by its ratio (the dtype
    cancels); the roofline that extrapolation relaxes to prices what RooflineCostModel does
    (kvsim.costmodel.family_rooflines.elementwise_roofline).
    """
    hidden = model.hidden_size
    g = model.layer_groups[0]
    heads = max(1, g.num_heads // tp)
    kvh = kv_heads_per_rank(g.num_kv_heads, tp) if g.kind != "mla" else 1
    qk = heads * max(g.head_dim_k, g.qk_nope_head_dim + g.qk_rope_head_dim)
    inter = max(1, model.mlp_groups[0].intermediate_size // tp) if model.mlp_groups else 0
    elements = 4 * hidden + 6 * hidden + 2 * (qk + kvh * g.head_dim_k) + 3 * inter
    elements += kvh * (g.head_dim_k + g.head_dim_v)
    return elements * weight_dtype_bytes(dtype)

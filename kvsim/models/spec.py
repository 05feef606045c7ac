"""What a model is, as far as KV cache and cost are concerned: layer groups, MLP shapes, sizes.

A model is a stack of layers; layers with the same attention shape form a *layer group*. The
group is the unit of KV sizing (vLLM's `kv_cache_interface` has one spec per group too), so a
mixed local/global model such as Gemma-2 is two groups and a Mamba-attention hybrid is an
attention group plus a linear group. Which layer sits where does not change any size, so groups
record counts, not positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AttentionKind = Literal["full", "sliding", "mla", "linear", "none"]
ATTENTION_KINDS: tuple[str, ...] = ("full", "sliding", "mla", "linear", "none")


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share one attention shape (the unit of KV sizing).

    ``full`` covers MHA, GQA and MQA: they differ only in ``num_kv_heads`` against ``num_heads``.
    ``sliding`` keeps per-token KV like ``full`` but attends to the last ``window`` tokens only.
    ``mla`` stores one latent of ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer.
    ``linear`` (Mamba, linear attention) keeps a fixed ``state_bytes_per_seq`` and no per-token KV.
    ``none`` has no attention at all (it still counts its parameters through the MLP groups).

    ``kv_sharing_factor`` models cross-layer KV sharing: every run of that many layers stores one
    layer's KV and the others reuse it, so only ``ceil(layers / factor)`` layers hold KV.
    """

    kind: AttentionKind
    layers: int
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim_k: int = 0
    head_dim_v: int = 0
    window: int | None = None
    attention_bias: bool = False
    kv_sharing_factor: int = 1
    # MLA (DeepSeek-V2/V3): low-rank query and KV projections.
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Linear attention / Mamba: fixed per-sequence state (whole model group, all ranks together).
    state_bytes_per_seq: int = 0
    mamba_d_inner: int = 0
    mamba_d_state: int = 0
    mamba_d_conv: int = 0
    mamba_dt_rank: int = 0
    mixer_params_per_layer: int | None = None

    @property
    def kv_layers(self) -> int:
        """Layers that store their own per-token KV (the rest reuse a neighbour's)."""
        if self.kind not in ("full", "sliding", "mla"):
            return 0
        return -(-self.layers // self.kv_sharing_factor)


@dataclass(frozen=True)
class MlpGroup:
    """Layers with one feed-forward shape: dense (``num_experts == 0``) or mixture of experts.

    All catalog models use gated MLPs (SwiGLU / GeGLU): three ``hidden × intermediate`` matrices
    per expert. Shared experts (DeepSeek) run for every token, next to ``experts_per_token``
    routed ones.
    """

    layers: int
    intermediate_size: int
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    shared_intermediate_size: int | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


@dataclass(frozen=True)
class ModelSpec:
    """A model's shapes, from its published config.json; sizes are derived, never stored."""

    name: str
    hf_config: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_attention_heads: int
    tie_word_embeddings: bool
    layer_groups: tuple[LayerGroup, ...]
    mlp_groups: tuple[MlpGroup, ...]
    norms_per_layer: int = 2
    #: The dtype the published weights are served in (the catalog's ``weight_dtype``): what a run
    #: uses unless told otherwise. bf16 unless the model's config.json says else (DeepSeek-V3's
    #: ``quantization_config`` makes it fp8).
    weight_dtype: str = "bf16"
    #: The longest sequence (prompt + output tokens) the model serves: its config.json
    #: ``max_position_embeddings``, or the model card's figure where that differs. vLLM's
    #: ``max_model_len`` defaults to it and refuses a request beyond it; the engine does the same.
    #: None where a spec does not say (a hand-built spec): no limit.
    max_context_tokens: int | None = None

    @property
    def num_params(self) -> int:
        """Total parameters counted from the shapes (see ``kvsim.models.params``)."""
        from kvsim.models.params import count_params

        return count_params(self).total

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (differs from ``num_params`` for MoE)."""
        from kvsim.models.params import count_params

        return count_params(self).active

    @property
    def embedding_params(self) -> int:
        """One vocabulary × hidden matrix (the input lookup table)."""
        return self.vocab_size * self.hidden_size

    @property
    def is_mla(self) -> bool:
        return any(g.kind == "mla" for g in self.layer_groups)

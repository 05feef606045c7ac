"""KV-cache and weight dtypes: bytes per element and the scale overhead each quantisation adds.

One rule per KV dtype (a ``KvDtype`` object can be passed anywhere a name is, to use another):

- ``bf16`` / ``fp16``: 2 B per element, no scales.
- ``fp8``: 1 B per element with a per-tensor scale (vLLM's default ``fp8`` KV cache with
  ``k_scale`` / ``v_scale`` per layer): a few bytes per layer, not per token, so counted as 0.
- ``int8`` / ``int4``: 1 B / 0.5 B per element plus one fp32 scale per token per KV head for K
  and one for V, as in vLLM's per-token-head quantisation (algorithms.md: "adds 2 × block_size ×
  kv_heads × 4 bytes of scales" per layer and block). An MLA latent is one vector per token, so
  it gets one scale, not two.
- ``fp8_ds_mla``: MLA only, the FlashMLA / vLLM ``fp8_ds_mla`` layout: the 512-element latent in
  fp8 with one fp32 scale per 128 elements, the rope part kept in bf16: 512 + 16 + 128 = 656 B
  per token per layer for DeepSeek-V3 (algorithms.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import UnknownNameError


@dataclass(frozen=True)
class KvDtype:
    """How one cached element is stored, and the scales quantisation adds per token and head."""

    name: str
    element_bytes: float
    scale_bytes: int = 0  # bytes of one scale (fp32 = 4); 0 means no per-token scales
    mla_latent_group: int | None = None  # fp8_ds_mla: one scale per this many latent elements
    mla_rope_bytes: float | None = None  # fp8_ds_mla: rope part kept at this width


KV_DTYPES: dict[str, KvDtype] = {
    d.name: d
    for d in (
        KvDtype("bf16", 2),
        KvDtype("fp16", 2),
        KvDtype("fp8", 1),
        KvDtype("int8", 1, scale_bytes=4),
        KvDtype("int4", 0.5, scale_bytes=4),
        KvDtype("fp8_ds_mla", 1, scale_bytes=4, mla_latent_group=128, mla_rope_bytes=2),
    )
}

# Weights: quantisation scales (per channel or per 128-group) are under 1 % and left out.
WEIGHT_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


def kv_dtype(value: str | KvDtype) -> KvDtype:
    """The ``KvDtype`` for a name, or ``value`` itself when it already is one."""
    if isinstance(value, KvDtype):
        return value
    try:
        return KV_DTYPES[value]
    except KeyError:
        raise UnknownNameError("kv dtype", value, list(KV_DTYPES)) from None


def weight_dtype_bytes(value: str) -> float:
    """Bytes per weight for a dtype name."""
    try:
        return WEIGHT_DTYPE_BYTES[value]
    except KeyError:
        raise UnknownNameError("weight dtype", value, list(WEIGHT_DTYPE_BYTES)) from None

"""Models: shapes from published configs, and exact KV, weight and FLOP sizes per TP rank."""

from kvsim.models.catalog import load_model, model_names, parse_model
from kvsim.models.dtypes import KV_DTYPES, WEIGHT_DTYPE_BYTES, KvDtype
from kvsim.models.params import ParamCount, count_params
from kvsim.models.sizing import (
    AttentionCost,
    attention_costs,
    check_tp,
    kv_bytes_per_block,
    kv_bytes_per_token,
    kv_heads_per_rank,
    linear_flops_per_token,
    mha_equivalent_bytes_per_token,
    mla_overprovisioning,
    sequence_kv_bytes,
    tp_degrees,
    weight_bytes,
)
from kvsim.models.spec import LayerGroup, MlpGroup, ModelSpec

__all__ = [
    "KV_DTYPES",
    "WEIGHT_DTYPE_BYTES",
    "AttentionCost",
    "KvDtype",
    "LayerGroup",
    "MlpGroup",
    "ModelSpec",
    "ParamCount",
    "attention_costs",
    "check_tp",
    "count_params",
    "kv_bytes_per_block",
    "kv_bytes_per_token",
    "kv_heads_per_rank",
    "linear_flops_per_token",
    "load_model",
    "mha_equivalent_bytes_per_token",
    "mla_overprovisioning",
    "model_names",
    "parse_model",
    "sequence_kv_bytes",
    "tp_degrees",
    "weight_bytes",
]

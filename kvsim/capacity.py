"""How much KV cache fits on a GPU for a model: the report behind ``kvsim size``.

Budget per rank, as vLLM reckons it: ``hbm × gpu_memory_utilization − weights − activation
reserve``; what is left holds KV blocks. Each logical block spans every TP rank (each rank holds
its own heads, or a replica of the MLA latent), so blocks, tokens and sequences are the same per
rank and per replica, while bytes per replica are bytes per rank × tp.
"""

from __future__ import annotations

import math
from typing import Any

from kvsim.errors import ConfigError, KvsimError
from kvsim.models.dtypes import kv_dtype as resolve_kv_dtype
from kvsim.models.sizing import (
    attention_costs,
    kv_bytes_per_block,
    kv_bytes_per_token,
    mha_equivalent_bytes_per_token,
    mla_overprovisioning,
    sequence_kv_bytes,
    weight_bytes,
)
from kvsim.models.spec import ModelSpec
from kvsim.units import format_bytes

# Our assumption, not a measurement: the peak activations of a few-thousand-token forward pass,
# CUDA graphs and the CUDA context's non-torch memory, per rank. vLLM measures this in its
# profiling run; pass the figure measured for your setup as ``activation_reserve_bytes``.
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * 2**30


def _gb(n: float) -> str:
    gigabytes = n / 1e9
    return f"{gigabytes:.0f} GB" if gigabytes == round(gigabytes) else f"{gigabytes:.1f} GB"


def capacity_report(
    spec: ModelSpec,
    *,
    hbm_bytes_per_gpu: int | None,
    gpu_memory_utilization: float = 0.9,
    tp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    context_tokens: int = 32768,
    block_size: int = 16,
    activation_reserve_bytes: int | None = None,
    max_num_batched_tokens: int = 1,
    strict: bool = True,
) -> dict[str, Any]:
    """KV sizes of ``spec`` and, given the GPU's HBM, how many tokens and sequences fit.

    Keys carry their unit (``_bytes``, ``_tokens``); the dict is JSON-serialisable. With
    ``hbm_bytes_per_gpu=None`` only the sizes are filled in and the capacity keys are None.
    When the weights (plus the activation reserve) do not fit, ``strict`` raises ``KvsimError``;
    otherwise the report keeps its sizes, leaves the capacity keys None and says so as a finding:
    ``fits`` False, ``finding`` the sentence, ``smallest_tp_that_fits`` (None if none does).
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(
            f"gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization}"
        )
    if context_tokens < 1:
        raise ConfigError(f"context_tokens: must be ≥ 1, got {context_tokens}")
    resolve_kv_dtype(kv_dtype)  # unknown names fail here, before any arithmetic
    per_token = kv_bytes_per_token(spec, kv_dtype, tp)
    per_block = kv_bytes_per_block(spec, block_size, kv_dtype, tp)
    per_seq = sequence_kv_bytes(
        spec, context_tokens, kv_dtype, tp, block_size, max_num_batched_tokens
    )
    weights = weight_bytes(spec, weight_dtype, tp)
    state = sum(c.state_bytes_per_seq for c in attention_costs(spec, kv_dtype, tp))
    report: dict[str, Any] = {
        "model": spec.name,
        "hf_config": spec.hf_config,
        "num_params": spec.num_params,
        "active_params": spec.active_params,
        "tp": tp,
        "kv_dtype": kv_dtype,
        "weight_dtype": weight_dtype,
        "block_size_tokens": block_size,
        "context_tokens": context_tokens,
        "kv_bytes_per_token_per_rank": per_token,
        "kv_bytes_per_token_per_replica": per_token * tp,
        "kv_bytes_per_block_per_rank": per_block,
        "kv_bytes_per_block_per_replica": per_block * tp,
        "state_bytes_per_seq_per_rank": math.ceil(state),
        "sequence_kv_bytes_per_rank": per_seq,
        "sequence_kv_bytes_per_replica": per_seq * tp,
        "weight_bytes_per_rank": weights,
        "weight_bytes_per_replica": weights * tp,
        "hbm_bytes_per_gpu": hbm_bytes_per_gpu,
        "gpu_memory_utilization": gpu_memory_utilization,
        "activation_reserve_bytes_per_rank": None,
        "kv_capacity_bytes_per_rank": None,
        "kv_capacity_bytes_per_replica": None,
        "kv_blocks": None,
        "max_tokens": None,
        "max_concurrent_sequences": None,
    }
    if spec.is_mla:
        mha_per_token = mha_equivalent_bytes_per_token(spec, kv_dtype, tp)
        report["mla_overprovisioning"] = mla_overprovisioning(spec, kv_dtype)
        report["mha_equivalent_kv_bytes_per_token_per_rank"] = mha_per_token
        report["mha_equivalent_sequence_kv_bytes_per_rank"] = (
            -(-context_tokens // block_size) * block_size * mha_per_token
        )
        report["mha_equivalent_max_concurrent_sequences"] = None
        report["extra_sequences_vs_mha"] = None
    if hbm_bytes_per_gpu is None:
        return report

    reserve = (
        DEFAULT_ACTIVATION_RESERVE_BYTES
        if activation_reserve_bytes is None
        else activation_reserve_bytes
    )
    usable = int(hbm_bytes_per_gpu * gpu_memory_utilization)
    budget = f"the GPU has {_gb(hbm_bytes_per_gpu)} × {gpu_memory_utilization:.2f}"
    where = f"{spec.name} {weight_dtype} weights need {_gb(weights)} per rank at tp={tp}"
    capacity = usable - weights - reserve
    problem = None
    if weights > usable:
        problem = f"{where} but {budget}"
    elif capacity <= 0:
        problem = (
            f"{where}, plus a {_gb(reserve)} activation reserve, leaving no room for KV "
            f"cache: {budget}"
        )
    if problem and strict:
        raise KvsimError(f"{problem}; use a larger --tp or a smaller --weight-dtype")
    if problem:
        smallest = _smallest_tp(spec, usable, reserve, weight_dtype, tp)
        advice = f"tp={smallest} is the smallest that fits" if smallest else "no tp degree fits"
        report.update(
            fits=False,
            finding=f"does not fit at tp={tp}: {problem}; {advice}",
            smallest_tp_that_fits=smallest,
        )
        return report
    report["fits"] = True
    blocks = capacity // per_block if per_block else 0
    sequences = capacity // per_seq if per_seq else 0
    report.update(
        activation_reserve_bytes_per_rank=reserve,
        kv_capacity_bytes_per_rank=capacity,
        kv_capacity_bytes_per_replica=capacity * tp,
        kv_blocks=blocks,
        max_tokens=blocks * block_size,
        max_concurrent_sequences=sequences,
    )
    if spec.is_mla:
        mha_sequences = capacity // report["mha_equivalent_sequence_kv_bytes_per_rank"]
        report["mha_equivalent_max_concurrent_sequences"] = mha_sequences
        report["extra_sequences_vs_mha"] = sequences - mha_sequences
    return report


def _smallest_tp(
    spec: ModelSpec, usable: int, reserve: int, weight_dtype: str, above: int
) -> int | None:
    """The smallest tp degree vLLM accepts for `spec` above `above` that leaves room for KV."""
    from kvsim.models.sizing import tp_degrees

    for tp in tp_degrees(spec):
        if tp > above and usable - weight_bytes(spec, weight_dtype, tp) - reserve > 0:
            return tp
    return None


def _row_value(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if key != "mla_overprovisioning" else f"{value:.1f}×"
    if isinstance(value, int) and "bytes" in key:
        return f"{format_bytes(value)}  ({value:,} B)"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


_LABELS: dict[str, str] = {
    "model": "model",
    "hf_config": "config",
    "num_params": "parameters (total)",
    "active_params": "parameters (active per token)",
    "tp": "tensor parallel",
    "kv_dtype": "KV dtype",
    "weight_dtype": "weight dtype",
    "block_size_tokens": "block size (tokens)",
    "context_tokens": "context (tokens)",
    "kv_bytes_per_token_per_rank": "KV per token, per rank",
    "kv_bytes_per_token_per_replica": "KV per token, per replica",
    "kv_bytes_per_block_per_rank": "KV per block, per rank",
    "state_bytes_per_seq_per_rank": "fixed state per sequence, per rank",
    "sequence_kv_bytes_per_rank": "KV per sequence at context, per rank",
    "weight_bytes_per_rank": "weights per rank",
    "hbm_bytes_per_gpu": "HBM per GPU",
    "gpu_memory_utilization": "GPU memory utilization",
    "activation_reserve_bytes_per_rank": "activation reserve per rank",
    "kv_capacity_bytes_per_rank": "KV capacity per rank",
    "kv_capacity_bytes_per_replica": "KV capacity per replica",
    "kv_blocks": "KV blocks",
    "max_tokens": "tokens that fit",
    "max_concurrent_sequences": "sequences at context",
    "mla_overprovisioning": "MHA-equivalent / MLA bytes (tp=1)",
    "mha_equivalent_kv_bytes_per_token_per_rank": "MHA-equivalent KV per token, per rank",
    "mha_equivalent_max_concurrent_sequences": "sequences if sized as MHA",
    "extra_sequences_vs_mha": "extra sequences from exact sizing",
}


def format_capacity(report: dict[str, Any]) -> str:
    """The report as an aligned two-column table for the terminal."""
    rows = [
        (label, _row_value(key, report[key]))
        for key, label in _LABELS.items()
        if key in report and not (key.startswith("state_") and not report[key])
    ]
    if report.get("fits") is False:
        rows.append(("finding", report["finding"]))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def profile_capacity_report(spec: ModelSpec, profile: Any, **options: Any) -> dict[str, Any]:
    """`capacity_report` with the HBM and utilisation of a HardwareProfile's GPU."""
    return capacity_report(
        spec,
        hbm_bytes_per_gpu=profile.gpu.hbm_bytes,
        gpu_memory_utilization=profile.gpu_memory_utilization,
        **options,
    )


def node_tier_capacity(
    spec: ModelSpec,
    profile: Any,
    *,
    tp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    block_size: int = 16,
) -> list[dict[str, Any]]:
    """KV tokens one node can hold in each tier of `profile` (a HardwareProfile), enabled or not.

    HBM: what is left after weights on each of the node's `gpus_per_node / tp` replicas. Below
    HBM a token needs its KV from every rank (bytes per token per replica); a shared tier (RDMA
    pool, parallel FS) counts the node's fair share, capacity / shared_by_nodes.
    """
    report = profile_capacity_report(
        spec, profile, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype, block_size=block_size
    )
    replicas = profile.gpus_per_node / tp
    per_token = report["kv_bytes_per_token_per_replica"]
    rows = []
    for tier in profile.tiers:
        if tier.name == "hbm":
            kv_bytes = report["kv_capacity_bytes_per_replica"] * replicas
            tokens = report["max_tokens"] * replicas
        else:
            kv_bytes = tier.capacity_bytes / max(tier.shared_by_nodes, 1)
            tokens = kv_bytes // per_token
        rows.append(
            {
                "tier": tier.name,
                "enabled": tier.enabled,
                "kv_bytes_per_node": int(kv_bytes),
                "kv_tokens_per_node": int(tokens),
            }
        )
    return rows


def format_tier_capacity(rows: list[dict[str, Any]]) -> str:
    """The per-tier table with a running total, so 'HBM only' and 'all tiers' read off it."""
    lines = [f"{'tier':<6}{'KV per node':>16}{'tokens':>18}{'cumulative tokens':>20}"]
    total = 0
    for row in rows:
        total += row["kv_tokens_per_node"]
        lines.append(
            f"{row['tier']:<6}{format_bytes(row['kv_bytes_per_node']):>16}"
            f"{row['kv_tokens_per_node']:>18,}{total:>20,}"
        )
    return "\n".join(lines)

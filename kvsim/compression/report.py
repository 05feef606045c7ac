"""What ``kvsim size --compression`` prints: the compressed sizes beside the uncompressed ones."""

from __future__ import annotations

from typing import Any

from kvsim.compression.base import Compression
from kvsim.compression.quality import quality, quality_reason
from kvsim.compression.sizing import bytes_per_kept_token, compressed_kv_bytes, host_kv_bytes
from kvsim.models.sizing import kv_bytes_per_token
from kvsim.models.spec import ModelSpec
from kvsim.units import format_bytes

__all__ = ["compression_report", "format_compression"]


def compression_report(
    spec: ModelSpec,
    comp: Compression,
    context_tokens: int,
    kv_dtype: str = "bf16",
    tp: int = 1,
    kv_capacity_bytes: int | None = None,
) -> dict[str, Any]:
    """JSON-ready sizes of one sequence of ``context_tokens`` under ``comp`` on one rank.

    ``sequences_at_context`` divides ``kv_capacity_bytes`` (the HBM left for KV per rank, when
    known) by the exact compressed bytes, so it ignores page rounding.
    """
    plain = context_tokens * kv_bytes_per_token(spec, kv_dtype, tp)
    packed = compressed_kv_bytes(spec, comp, context_tokens, kv_dtype, tp)
    point = quality(comp)
    report: dict[str, Any] = {
        "label": comp.label,
        "kept_tokens": comp.kept_tokens(context_tokens),
        "read_tokens": comp.read_tokens(context_tokens),
        "bytes_per_kept_token_per_rank": bytes_per_kept_token(spec, comp, kv_dtype, tp),
        "sequence_kv_bytes_per_rank": packed,
        "uncompressed_sequence_kv_bytes_per_rank": plain,
        "compression_ratio": plain / packed if packed else None,
        "host_kv_bytes_per_rank": host_kv_bytes(spec, comp, context_tokens, kv_dtype, tp),
        "sequences_at_context": (
            kv_capacity_bytes // packed if kv_capacity_bytes is not None and packed else None
        ),
        "quality_retained": point.retained if point else None,
        "quality_source": point.source if point else None,
        "quality_note": quality_reason(comp),
    }
    return report


_LABELS = {
    "label": "compression",
    "kept_tokens": "tokens kept per head (mean over layers)",
    "read_tokens": "tokens read per decode step",
    "bytes_per_kept_token_per_rank": "KV per kept token, per rank",
    "sequence_kv_bytes_per_rank": "compressed KV per sequence, per rank",
    "uncompressed_sequence_kv_bytes_per_rank": "uncompressed KV per sequence, per rank",
    "compression_ratio": "compression ratio",
    "host_kv_bytes_per_rank": "KV offloaded to CPU DRAM, per rank",
    "sequences_at_context": "sequences at context (compressed)",
    "quality_retained": "quality retained",
    "quality_source": "quality source",
    "quality_note": "quality note",
}


def _value(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "compression_ratio":
        return f"{value:.2f}×"
    if key == "quality_retained":
        return f"{value:.3f}"
    if "bytes" in key:
        return f"{format_bytes(value)}  ({value:,.0f} B)"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_compression(report: dict[str, Any]) -> str:
    """The compression rows as an aligned two-column table."""
    rows = [(label, _value(key, report[key])) for key, label in _LABELS.items()]
    if not report["host_kv_bytes_per_rank"]:
        rows = [r for r in rows if r[0] != _LABELS["host_kv_bytes_per_rank"]]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)

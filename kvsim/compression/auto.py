"""MetaKV-style selection: one compression per request under latency and memory budgets.

Reconstruction (no published algorithm is followed line by line): among the candidates that meet
both budgets, pick the one of highest quality; when none does, pick the one with the fewest bytes.
Quality is ``quality_rank`` unless the caller passes its own ``quality_of``: the published
fraction of the uncompressed score retained (``kvsim.compression.quality``), 1.0 for ``none``;
candidates without a published number rank below every candidate with one. Ties keep the
candidates' order. The function is pure: the engine passes its latency predictor and byte count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvsim.compression.base import Compression
from kvsim.errors import ConfigError

__all__ = ["choose", "quality_rank"]


def quality_rank(comp: Compression) -> float | None:
    """The retained fraction ``choose`` ranks by: 1.0 uncompressed, the published point, or None."""
    from kvsim.compression.quality import quality

    if comp.identity:
        return 1.0
    point = quality(comp)
    return None if point is None or point.retained is None else point.retained


def choose(
    candidates: Sequence[Compression],
    context_tokens: int,
    predicted_latency_s: Callable[[Compression], float],
    latency_budget_s: float,
    memory_budget_bytes: float,
    bytes_of: Callable[[Compression], int],
    quality_of: Callable[[Compression], float | None] = quality_rank,
) -> Compression:
    """The highest-quality candidate within both budgets, else the one with the fewest bytes.

    ``context_tokens`` is the request's context (for callers' predictors; the rule itself reads
    only the callbacks). Ties on quality, and on bytes, keep the order of ``candidates``.
    """
    if not candidates:
        raise ConfigError("compression auto: no candidates to choose from")
    if context_tokens < 0:
        raise ConfigError(f"context_tokens: must be ≥ 0, got {context_tokens}")
    sizes = [bytes_of(c) for c in candidates]
    fitting = [
        i
        for i, c in enumerate(candidates)
        if sizes[i] <= memory_budget_bytes and predicted_latency_s(c) <= latency_budget_s
    ]
    if not fitting:
        return candidates[min(range(len(candidates)), key=lambda i: (sizes[i], i))]

    def rank(i: int) -> tuple[int, float, int]:
        q = quality_of(candidates[i])
        return (0, -q, i) if q is not None else (1, 0.0, i)

    return candidates[min(fitting, key=rank)]

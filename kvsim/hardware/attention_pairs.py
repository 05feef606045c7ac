"""(query, key) pairs of a prefill chunk: the measure of its attention work.

A measured prefill table is indexed by pair count (so one curve prices any mix of new tokens and
cached context), and both cost models count a chunk's pairs the same way, whole or windowed.
"""


def causal_pairs(new: float, context: float) -> float:
    """(query, key) pairs of a causal chunk of ``new`` tokens after ``context``."""
    return new * context + new * (new + 1) / 2


def windowed_pairs(context: int, new: int, window: int) -> float:
    """Sum over i in [0, new) of min(context + i + 1, window)."""
    # queries whose attended span is still growing: context + i + 1 < window
    growing = max(0, min(new, window - context - 1))
    pairs = growing * (context + 1) + growing * (growing - 1) / 2
    return pairs + (new - growing) * window

"""Trace statistics, including the reuse ceiling: the best prefix hit ratio any cache could reach.

Reuse ceiling: requests in arrival order against an infinite cache at one block size. A prompt's
full block hits when an earlier request's prompt or reply (when content-addressed) produced the
same block hash; since block hashes name the whole prefix, the hits are a prefix of the prompt.
Token-weighted: hit blocks x block size / all prompt tokens. Partial last blocks never hit.
"""

from __future__ import annotations

import numpy as np

from kvsim.traces.blocks import row_chunks, table_block_ids
from kvsim.traces.schema import Trace

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "reuse_ceiling",
    "reused_blocks",
    "reused_from_ids",
    "trace_stats",
]

DEFAULT_BLOCK_SIZE = 16
_PCTS = (50, 90, 99)


def reused_blocks(
    trace: Trace, block_size: int, cap_blocks: np.ndarray | None = None
) -> np.ndarray:
    """Per request, the prompt blocks an infinite cache would hold when it arrives (at most
    `cap_blocks` of them: the engine computes at least one prompt token, so it passes
    (input - 1) // block_size; default, every full prompt block)."""
    table = trace.table
    # each content-addressed reply is one more segment: the sequence that gets cached
    offsets, ids = table_block_ids(table, block_size)
    inputs = table.column("input_tokens").to_numpy().astype(np.int64)
    cap = inputs // block_size if cap_blocks is None else cap_blocks
    return reused_from_ids(offsets, ids, cap)


#: blocks `reused_from_ids` takes at a time (its temporaries are about 30 bytes a block: a
#: window of millions of requests has hundreds of millions)
REUSE_BLOCKS = 1 << 22


def reused_from_ids(offsets: np.ndarray, ids: np.ndarray, cap_blocks: np.ndarray) -> np.ndarray:
    """`reused_blocks` from every request's chain of first-seen ids (kvsim.traces.blocks
    .sequence_block_ids, rows delimited by `offsets`): a block hits when its id was seen earlier,
    which, ids being numbered by first appearance, is when it is no larger than every id before.
    Whole rows of about `REUSE_BLOCKS` blocks at a time, carrying the largest id so far."""
    n = offsets.size - 1
    out = np.zeros(n, dtype=np.int64)
    top = 0  # the largest id before the rows in hand (ids start at 1)
    for a, b in row_chunks(offsets, REUSE_BLOCKS):
        lo, hi = offsets[a], offsets[b]
        part = ids[lo:hi]
        if not part.size:
            continue
        before = np.maximum.accumulate(part)
        seen = np.empty(part.size, dtype=bool)
        seen[0] = part[0] <= top
        seen[1:] = part[1:] <= np.maximum(before[:-1], top)
        top = max(top, int(before[-1]))
        row = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(offsets[a : b + 1]))
        k = np.arange(part.size, dtype=np.int64) - (offsets[a:b] - lo)[row]
        hit = seen & (k < cap_blocks[a:b][row])
        out[a:b] = np.bincount(row[hit], minlength=b - a)
    return out


def reuse_ceiling(trace: Trace, block_size: int) -> tuple[float, float]:
    """(token-weighted, block-weighted) prefix hit ratio with an infinite cache."""
    inputs = trace.table.column("input_tokens").to_numpy().astype(np.int64)
    hits = int(reused_blocks(trace, block_size).sum())
    total_tokens = int(inputs.sum())
    token_ratio = hits * block_size / total_tokens if total_tokens else 0.0
    # Block-weighted over all prompt blocks, the last partial one included.
    all_blocks = int((-(-inputs // block_size)).sum())
    block_ratio = hits / all_blocks if all_blocks else 0.0
    return token_ratio, block_ratio


def _cv(values: np.ndarray) -> float:
    return float(values.std() / values.mean()) if values.size > 1 and values.mean() > 0 else 0.0


def trace_stats(trace: Trace, block_size: int | None = None) -> dict:
    """One flat dict of figures (JSON-ready)."""
    table = trace.table
    inputs = table.column("input_tokens").to_numpy().astype(np.int64)
    outputs = table.column("output_tokens").to_numpy().astype(np.int64)
    arrival = table.column("arrival_s").to_numpy()
    turn = table.column("turn").to_numpy()
    sessions = int(np.unique(table.column("session_id").to_numpy()).size)
    block = block_size or trace.native_block_size or DEFAULT_BLOCK_SIZE
    token_ratio, block_ratio = reuse_ceiling(trace, block)
    gaps = np.diff(np.sort(arrival[turn == 0])) if sessions > 2 else np.zeros(0)
    stats = {
        "name": trace.name,
        "description": trace.description,
        "requests": int(table.num_rows),
        "sessions": sessions,
        "turns_per_session": table.num_rows / sessions if sessions else 0.0,
        "max_turns": int(turn.max()) + 1 if turn.size else 0,
        "duration_s": float(arrival.max() - arrival.min()) if arrival.size else 0.0,
        "input_tokens_mean": float(inputs.mean()) if inputs.size else 0.0,
        "output_tokens_mean": float(outputs.mean()) if outputs.size else 0.0,
        "session_interarrival_cv": _cv(gaps),
        "block_size": block,
        "reuse_ceiling": token_ratio,
        "reuse_ceiling_blocks": block_ratio,
        "skipped_rows": trace.skipped_rows,
    }
    for label, values in (("input_tokens", inputs), ("output_tokens", outputs)):
        for p in _PCTS:
            stats[f"{label}_p{p}"] = float(np.percentile(values, p)) if values.size else 0.0
        stats[f"{label}_max"] = int(values.max()) if values.size else 0
    return stats

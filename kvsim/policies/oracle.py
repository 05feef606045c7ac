"""The one future-use oracle: when is a block next used? Belady reads it, in the engine and in
`kvsim mrc` alike, so the two upper bounds cannot drift apart.

Built from every access of a trace, `(key, time)`, where time is a clock (the engine: the
request's nominal arrival) or an access index (`kvsim mrc`).
"""

from __future__ import annotations

import math

import numpy as np


class FutureUses:
    """Sorted accesses per key; a lookup is one binary search inside the key's run."""

    def __init__(self, keys: np.ndarray, times: np.ndarray) -> None:
        self._order = np.lexsort((times, keys))
        self.hashes = keys[self._order]
        self.times = np.asarray(times, dtype=np.float64)[self._order]
        uniq, starts = np.unique(self.hashes, return_index=True)
        ends = np.append(starts[1:], len(self.hashes))[: len(starts)]  # none for no access
        self.span = dict(
            zip(uniq.tolist(), zip(starts.tolist(), ends.tolist(), strict=True), strict=True)
        )

    def __call__(self, key: int, now_s: float) -> float:
        """The first use of `key` after `now_s` (inf: never again)."""
        span = self.span.get(key)
        if span is None:
            return math.inf
        lo, hi = span
        i = lo + int(np.searchsorted(self.times[lo:hi], now_s, side="right"))
        return float(self.times[i]) if i < hi else math.inf

    def following(self) -> np.ndarray:
        """For each access, in the order given, the time of the next access to its key."""
        out = np.full(len(self.hashes), math.inf)
        same = self.hashes[1:] == self.hashes[:-1]
        out[self._order[:-1][same]] = self.times[1:][same]
        return out

"""LRU-K (O'Neil et al., SIGMOD 1993), K = 2 by default: evict by the K-th most recent access.

A block with fewer than K accesses has an infinite backward K-distance and goes first (LRU among
them); otherwise the block whose K-th most recent access is oldest goes. History is dropped when a
block leaves the tier (no retained-information period). Accesses are counted in a logical clock,
so ties cannot happen. Does not respect the prefix tree by construction.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, check_param
from kvsim.policies.priority import PriorityPolicy


@dataclass(frozen=True)
class LRUKParams:
    k: int = 2
    """Which most recent access orders blocks (2 = the database classic LRU-2)."""

    def __post_init__(self) -> None:
        check_param(1 <= self.k <= 1024, "k", "must be an integer in [1, 1024]")


class LRUK(PriorityPolicy):
    name = "lru-k"
    Params = LRUKParams

    def __init__(self, params: LRUKParams | None = None) -> None:
        super().__init__()
        self.params = params or LRUKParams()
        self._clock = 0
        self._history: dict[int, deque[int]] = {}

    def _priority(self, hist: deque[int]) -> tuple[int, int]:
        if len(hist) < self.params.k:
            return (0, hist[-1])
        return (1, hist[0])

    def add(self, key: int, info: BlockInfo) -> None:
        hist = self._history.get(key)
        if hist is None:
            self._clock += 1
            hist = self._history[key] = deque((self._clock,), maxlen=self.params.k)
        self._push(key, self._priority(hist))

    def access(self, key: int, info: BlockInfo) -> None:
        hist = self._history.get(key)
        if hist is None:
            return
        self._clock += 1
        hist.append(self._clock)
        if key in self._live:
            self._push(key, self._priority(hist))

    def forget(self, key: int) -> None:
        self._history.pop(key, None)

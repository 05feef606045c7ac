"""Least-frequently-used: evict the block with the fewest accesses since it entered the tier.

Ties go to the block whose count changed longest ago (LRU within a frequency), as libCacheSim's
LFU does; counts are forgotten when a block leaves the tier (no ghost history). Does not respect
the prefix tree by construction, though a parent is accessed at least as often as its children.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo
from kvsim.policies.priority import PriorityPolicy


class LFU(PriorityPolicy):
    name = "lfu"

    def __init__(self) -> None:
        super().__init__()
        self._freq: dict[int, int] = {}

    def add(self, key: int, info: BlockInfo) -> None:
        freq = self._freq.setdefault(key, 1)
        self._push(key, freq)

    def access(self, key: int, info: BlockInfo) -> None:
        freq = self._freq.get(key, 0) + 1
        self._freq[key] = freq
        if key in self._live:
            self._push(key, freq)

    def forget(self, key: int) -> None:
        self._freq.pop(key, None)

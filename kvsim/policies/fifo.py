"""First-in first-out: evict the block cached longest ago, whatever its hits.

A block keeps its first-insertion rank while it stays in the tier, also across pin/unpin, so the
order is true FIFO rather than "first released". Does not respect the prefix tree by construction.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo
from kvsim.policies.priority import PriorityPolicy


class FIFO(PriorityPolicy):
    name = "fifo"

    def __init__(self) -> None:
        super().__init__()
        self._rank: dict[int, int] = {}  # resident key -> insertion rank
        self._next = 0

    def add(self, key: int, info: BlockInfo) -> None:
        rank = self._rank.get(key)
        if rank is None:
            self._next += 1
            rank = self._rank[key] = self._next
        self._push(key, rank)

    def forget(self, key: int) -> None:
        self._rank.pop(key, None)

"""A base for policies that are really a priority: evict the evictable block with the lowest one.

STYLE habit 4: a subclass computes a priority when a block is added or touched and calls
``_push``; the base keeps a binary heap with lazy deletion, so add, touch and victim are
O(log n) and discard is O(1). Ties break by push order (older first) through a sequence number.
"""

from __future__ import annotations

import heapq
from typing import Any

from kvsim.policies.base import EvictionPolicy
from kvsim.policies.lazy_heap import live_head


class PriorityPolicy(EvictionPolicy):
    """Lowest priority is evicted first; subclasses decide priorities, the base orders them."""

    def __init__(self) -> None:
        self._heap: list[tuple[Any, int, int]] = []
        self._live: dict[int, tuple[Any, int, int]] = {}  # evictable key -> its current entry
        self._seq = 0

    def _push(self, key: int, priority: Any) -> None:
        """(Re)order an evictable ``key``; its older heap entries go stale."""
        self._seq += 1
        entry = (priority, self._seq, key)
        self._live[key] = entry
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._live) + 1024:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def discard(self, key: int) -> None:
        self._live.pop(key, None)

    def victim(self) -> int:
        entry = live_head(self._heap, self._live)
        if entry is None:
            raise LookupError("no evictable block")
        return entry[2]

    def __len__(self) -> int:
        return len(self._live)

"""Least-recently-used: evict the block that became evictable or was hit longest ago.

Under the engine's deepest-first release of a finished request's blocks this reproduces vLLM's
free-queue order (vLLM docs/design/prefix_caching.md): a request's last block is released first,
so among blocks released together the deepest is evicted first. LRU does not respect the prefix
tree by construction; the engine never counts a hit past a missing parent.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo, EvictionPolicy


class LRU(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        # dicts keep insertion order; popping and re-inserting moves a key to the MRU end in O(1)
        self._order: dict[int, None] = {}

    def add(self, key: int, info: BlockInfo) -> None:
        self._order[key] = None

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._order:
            del self._order[key]
            self._order[key] = None

    def discard(self, key: int) -> None:
        self._order.pop(key, None)

    def victim(self) -> int:
        try:
            return next(iter(self._order))
        except StopIteration:
            raise LookupError("no evictable block") from None

    def __len__(self) -> int:
        return len(self._order)

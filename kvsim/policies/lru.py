"""Least-recently-used: evict the block that became evictable or was hit longest ago.

Under the engine's deepest-first release of a finished request's blocks this reproduces vLLM's
free-queue order (vLLM docs/design/prefix_caching.md): a request's last block is released first,
so among blocks released together the deepest is evicted first. LRU does not respect the prefix
tree by construction; the engine never counts a hit past a missing parent.
"""

from __future__ import annotations

from collections import OrderedDict

from kvsim.policies.base import BlockInfo, EvictionPolicy


class LRU(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        # An OrderedDict, not a dict: a plain dict's first key is found by skipping the holes that
        # deletions from the front leave, which degrades `victim` towards O(n) on long runs.
        self._order: OrderedDict[int, None] = OrderedDict()

    def add(self, key: int, info: BlockInfo) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def add_many(
        self, keys: list[int], positions: list[int], parents: list[int], info: BlockInfo
    ) -> None:
        # the keys are not evictable yet (the pool guarantees it), so update() appends them
        self._order.update(dict.fromkeys(keys))

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def discard(self, key: int) -> None:
        self._order.pop(key, None)

    def evict(self, count: int) -> list[int]:
        popitem = self._order.popitem
        return [popitem(last=False)[0] for _ in range(count)]

    def victim(self) -> int:
        try:
            return next(iter(self._order))
        except StopIteration:
            raise LookupError("no evictable block") from None

    def __len__(self) -> int:
        return len(self._order)

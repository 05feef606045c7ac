"""An idealised radix cache: LRU over the leaf *blocks* of the prefix tree only.

This is the block-granular idealisation of SGLang's RadixAttention eviction, not SGLang as it
behaves (that is ``sglang``, kvsim.policies.sglang: whole radix nodes, which over-evict). Here
every block is its own node, so an eviction frees exactly the blocks asked for; on
mooncake-conversation at 512-token blocks it makes the same hits as vLLM's own block pool
(docs/validation.md).

A block is a leaf while no block naming it as parent is in the tier (pinned or not), so evicting
it never orphans a cached descendant: respects the prefix tree by construction. Evictable leaves
are ordered by last touch; when a leaf leaves the tier its parent may become a leaf and joins the
order at its own last-touch time (a heap keeps that O(log n)). Should no evictable leaf exist
(possible only when a tier caches a child without its parent), the least recent evictable
non-leaf is chosen rather than failing.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo
from kvsim.policies.priority import PriorityPolicy


class RadixLRU(PriorityPolicy):
    name = "radix-lru"
    respects_prefix = True

    def __init__(self) -> None:
        super().__init__()
        self._clock = 0
        self._touched: dict[int, int] = {}  # resident key -> last touch
        self._parent: dict[int, int] = {}  # resident key -> parent hash
        self._children: dict[int, int] = {}  # hash -> resident children count

    def _order(self, key: int) -> None:
        self._push(key, (1 if self._children.get(key) else 0, self._touched[key]))

    def add(self, key: int, info: BlockInfo) -> None:
        if key not in self._touched:
            self._parent[key] = info.parent
            if info.parent:
                count = self._children.get(info.parent, 0) + 1
                self._children[info.parent] = count
                if count == 1 and info.parent in self._live:
                    self._order(info.parent)
        self._clock += 1
        self._touched[key] = self._clock
        self._order(key)

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._touched:
            self._clock += 1
            self._touched[key] = self._clock
            if key in self._live:
                self._order(key)

    def forget(self, key: int) -> None:
        if self._touched.pop(key, None) is None:
            return
        parent = self._parent.pop(key)
        if parent:
            count = self._children[parent] - 1
            if count:
                self._children[parent] = count
            else:
                del self._children[parent]
                if parent in self._live:
                    self._order(parent)

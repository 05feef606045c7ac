"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), with libCacheSim's eviction details.

T1 holds blocks seen once, T2 blocks seen at least twice; ghost lists B1/B2 remember recent
evictions from each, and a ghost hit moves the target size p of T1 towards the list that would
have kept the block. As in libCacheSim, ghost lists are trimmed only when an eviction happens, and
a new block whose L1 (T1 + B1) is full evicts from T1 without a ghost when B1 is empty.

Queue sizes count pinned blocks too (they stay members of their list); only evictable blocks can
be chosen. The tier should call ``set_capacity`` and ``miss``; without ``miss`` a ghost hit is
detected when the block is added. Does not respect the prefix tree by construction.
"""

from __future__ import annotations

from collections import OrderedDict

from kvsim.policies.base import BlockInfo
from kvsim.policies.queues import QueuedPolicy


class ARC(QueuedPolicy):
    name = "arc"

    def __init__(self) -> None:
        super().__init__(2)  # T1, T2 in LRU order (front = least recent)
        self._ghost = (OrderedDict[int, None](), OrderedDict[int, None]())
        self._p = 0.0
        self._capacity = 0
        self._incoming: int | None = None  # key of the current miss
        self._incoming_ghost = -1  # which ghost list held it (-1: none)
        self._pending: tuple[int, bool] | None = (
            None  # chosen victim, and whether it leaves a ghost
        )

    def set_capacity(self, blocks: int) -> None:
        self._capacity = blocks

    def miss(self, key: int, info: BlockInfo) -> None:
        self._incoming = key
        self._incoming_ghost = -1
        b1, b2 = self._ghost
        if key in b1:
            self._p = min(self._p + max(len(b2) / len(b1), 1.0), self._capacity or float("inf"))
            del b1[key]
            self._incoming_ghost = 0
        elif key in b2:
            self._p = max(self._p - max(len(b1) / len(b2), 1.0), 0.0)
            del b2[key]
            self._incoming_ghost = 1

    def add(self, key: int, info: BlockInfo) -> None:
        if self._unpin(key):  # unpinned again: back to the MRU end of its list
            return
        if self._incoming != key:
            self.miss(key, info)
        to_t2 = self._incoming_ghost >= 0
        self._incoming, self._incoming_ghost = None, -1
        self._join(key, 1 if to_t2 else 0)

    def access(self, key: int, info: BlockInfo) -> None:
        which = self._where.get(key)
        if which is None:
            return
        evictable = self._q[which].pop(key, 0) is None
        if which == 0:
            self._where[key] = 1
            if not evictable:
                self._pinned[0] -= 1
                self._pinned[1] += 1
        if evictable:
            self._q[1][key] = None

    def forget(self, key: int) -> None:
        which = self._leave(key)
        if which is None:
            return
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == key and not pending[1]:
            return
        self._ghost[which][key] = None

    def _replace(self) -> int:
        t1, t2 = self._q
        n1 = self._size(0)
        from_t1 = (n1 > 0 and (n1 > self._p or (n1 == self._p and self._incoming_ghost == 1))) or (
            self._size(1) == 0
        )
        first, second = (t1, t2) if from_t1 else (t2, t1)
        queue = first or second  # pinned blocks may leave the chosen list with no candidate
        return next(iter(queue))

    def victim(self) -> int:
        t1, t2 = self._q
        if not t1 and not t2:
            raise LookupError("no evictable block")
        b1, b2 = self._ghost
        if self._incoming_ghost >= 0:
            key = self._replace()
            self._pending = (key, True)
            return key
        if self._size(0) + len(b1) + 1 > self._capacity:
            if b1:
                b1.popitem(last=False)
                key = self._replace()
                self._pending = (key, True)
            else:
                key = next(iter(t1 or t2))
                self._pending = (key, key not in t1)
            return key
        if self._size(0) + len(b1) + self._size(1) + len(b2) >= 2 * self._capacity and b2:
            b2.popitem(last=False)
        key = self._replace()
        self._pending = (key, True)
        return key

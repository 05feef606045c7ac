"""The bookkeeping ARC, 2Q and S3-FIFO share: blocks that live in numbered queues.

Each queue is an OrderedDict of its *evictable* members in order; a pinned member leaves the dict
but still counts towards its queue's size (these algorithms size queues by membership, not by
what can be evicted now). Subclasses decide which queue a new block joins and what to evict.
"""

from __future__ import annotations

from collections import OrderedDict

from kvsim.policies.base import EvictionPolicy


class QueuedPolicy(EvictionPolicy):
    """Membership, pin counts and the add/discard/forget moves common to queue policies."""

    def __init__(self, queues: int) -> None:
        self._q = tuple(OrderedDict[int, None]() for _ in range(queues))
        self._pinned = [0] * queues
        self._where: dict[int, int] = {}  # member key -> its queue

    def _size(self, i: int) -> int:
        """Members of queue i, pinned ones included."""
        return len(self._q[i]) + self._pinned[i]

    def _unpin(self, key: int) -> bool:
        """If `key` is already a member (it was pinned), put it back at its queue's end."""
        where = self._where.get(key)
        if where is None:
            return False
        self._pinned[where] -= 1
        self._q[where][key] = None
        return True

    def _join(self, key: int, where: int) -> None:
        self._where[key] = where
        self._q[where][key] = None

    def _leave(self, key: int) -> int | None:
        """Drop a (discarded) member; returns the queue it was in, None if it was not one."""
        where = self._where.pop(key, None)
        if where is not None:
            self._pinned[where] -= 1
        return where

    def discard(self, key: int) -> None:
        where = self._where.get(key)
        if where is not None and self._q[where].pop(key, 0) is None:
            self._pinned[where] += 1

    def __len__(self) -> int:
        return sum(len(q) for q in self._q)

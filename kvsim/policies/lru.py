"""Least-recently-used: evict the block that became evictable or was hit longest ago.

Under the engine's deepest-first release of a finished request's blocks this reproduces vLLM's
free-queue order (vLLM docs/design/prefix_caching.md): a request's last block is released first,
so among blocks released together the deepest is evicted first. LRU does not respect the prefix
tree by construction; the engine never counts a hit past a missing parent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from operator import eq

from kvsim.policies.base import BlockInfo, EvictionPolicy


class LRU(EvictionPolicy):
    """A FIFO of (key, stamp) entries with lazy deletion, kept as two parallel lists and a head
    index: a key's live entry is the one whose stamp equals ``_stamp[key]``. Every operation is
    O(1) amortised, and the batch hooks run in C (list slices, ``map``, ``dict.update``), which an
    OrderedDict's per-node allocation or a per-entry Python loop cannot match."""

    name = "lru"

    def __init__(self) -> None:
        self._stamp: dict[int, int] = {}  # evictable key -> stamp of its live queue entry
        self._keys: list[int] = []
        self._stamps: list[int] = []
        self._head = 0  # entries before it were consumed
        self._clock = 0

    def add(self, key: int, info: BlockInfo) -> None:
        self._clock += 1
        self._stamp[key] = self._clock
        self._keys.append(key)
        self._stamps.append(self._clock)

    def add_many(
        self, keys: list[int], positions: list[int], parents: Sequence[int], info: BlockInfo
    ) -> None:
        # one int object per stamp, shared by the dict and the queue (a range would make two)
        stamps = list(range(self._clock + 1, self._clock + 1 + len(keys)))
        self._clock += len(keys)
        self._stamp.update(zip(keys, stamps, strict=True))
        self._keys.extend(keys)
        self._stamps.extend(stamps)

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._stamp:
            self.add(key, info)

    def pin_many(self, keys: list[int], evictable: list[bool], info: BlockInfo) -> None:
        # a hit pins the block, so moving it to the MRU end first would be undone at once
        pop = self._stamp.pop
        for key in compress(keys, evictable):
            pop(key, None)
        self._compact()

    def discard(self, key: int) -> None:
        if self._stamp.pop(key, None) is not None:
            self._compact()

    def discard_many(self, keys: list[int]) -> None:
        pop = self._stamp.pop
        consume = deque(maxlen=0).extend  # at C speed
        consume(map(pop, keys, repeat(None)))
        self._compact()

    def _compact(self) -> None:
        """Drop consumed and stale entries once they outnumber live ones: O(live) memory."""
        if len(self._keys) - self._head > 2 * len(self._stamp) + 4096:
            keys = self._keys[self._head :]
            stamps = self._stamps[self._head :]
            live = list(map(eq, map(self._stamp.get, keys), stamps))
            self._keys = list(compress(keys, live))
            self._stamps = list(compress(stamps, live))
            self._head = 0
        elif self._head > 65536 and self._head * 2 > len(self._keys):
            del self._keys[: self._head]
            del self._stamps[: self._head]
            self._head = 0

    def victim(self) -> int:
        keys, stamps, get = self._keys, self._stamps, self._stamp.get
        head = self._head
        while head < len(keys):
            if get(keys[head]) == stamps[head]:
                self._head = head
                return keys[head]
            head += 1
        self._head = head
        raise LookupError("no evictable block")

    def evict(self, count: int) -> list[int]:
        victims: list[int] = []
        get = self._stamp.get
        while len(victims) < count:
            if self._head >= len(self._keys):
                raise LookupError("no evictable block")
            end = self._head + count - len(victims)
            keys = self._keys[self._head : end]
            live = list(map(eq, map(get, keys), self._stamps[self._head : end]))
            self._head = min(end, len(self._keys))
            victims += compress(keys, live)
        deque(map(self._stamp.pop, victims), maxlen=0)
        self._compact()
        return victims

    def __len__(self) -> int:
        return len(self._stamp)

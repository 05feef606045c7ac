"""SIEVE (Zhang et al., NSDI 2024): a FIFO queue with a hand that spares visited blocks once.

New blocks enter at the head; a hit sets a visited bit; the hand walks from the tail towards the
head clearing bits and stops at the first unvisited block, which is the victim, and keeps its
place for the next eviction. An intrusive doubly linked list on dicts keeps every step O(1)
amortised. Unpinned blocks re-enter at the head, keeping their visited bit. Does not respect the
prefix tree by construction.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo, EvictionPolicy


class Sieve(EvictionPolicy):
    name = "sieve"

    def __init__(self) -> None:
        self._newer: dict[int, int | None] = {}  # towards the head
        self._older: dict[int, int | None] = {}  # towards the tail
        self._head: int | None = None
        self._tail: int | None = None
        self._hand: int | None = None
        self._visited: dict[int, bool] = {}  # resident key -> visited bit

    def add(self, key: int, info: BlockInfo) -> None:
        self._visited.setdefault(key, False)
        head = self._head
        self._older[key] = head
        self._newer[key] = None
        if head is not None:
            self._newer[head] = key
        else:
            self._tail = key
        self._head = key

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._visited:
            self._visited[key] = True

    def discard(self, key: int) -> None:
        if key not in self._older:
            return
        older = self._older.pop(key)
        newer = self._newer.pop(key)
        if self._hand == key:
            self._hand = newer
        if older is not None:
            self._newer[older] = newer
        else:
            self._tail = newer
        if newer is not None:
            self._older[newer] = older
        else:
            self._head = older

    def forget(self, key: int) -> None:
        self._visited.pop(key, None)

    def victim(self) -> int:
        if self._tail is None:
            raise LookupError("no evictable block")
        visited = self._visited
        key = self._hand if self._hand is not None else self._tail
        while visited[key]:
            visited[key] = False
            key = self._newer[key]
            if key is None:
                key = self._tail
        self._hand = key
        return key

    def __len__(self) -> int:
        return len(self._older)

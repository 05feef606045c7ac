"""Mooncake's LengthAwareCache: LFU-like, and among equally used blocks a request's later ones go
first.

Priority = (accesses, -position, last touch): fewest accesses first; ties go to the deepest block,
so a request's tail is dropped before its head, which keeps the surviving part a usable prefix.
Respects the prefix tree only among blocks of equal frequency (a parent is accessed at least as
often as its children, so a parent never goes before a child of lower frequency).
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo
from kvsim.policies.priority import PriorityPolicy


class MooncakeLength(PriorityPolicy):
    name = "mooncake-length"

    def __init__(self) -> None:
        super().__init__()
        self._meta: dict[int, list[int]] = {}  # resident key -> [accesses, position]

    def add(self, key: int, info: BlockInfo) -> None:
        meta = self._meta.get(key)
        if meta is None:
            meta = self._meta[key] = [1, info.position]
        self._push(key, (meta[0], -meta[1]))

    def access(self, key: int, info: BlockInfo) -> None:
        meta = self._meta.get(key)
        if meta is not None:
            meta[0] += 1
            if key in self._live:
                self._push(key, (meta[0], -meta[1]))

    def forget(self, key: int) -> None:
        self._meta.pop(key, None)

"""Belady's MIN: evict the block whose next use is farthest in the future (offline optimum).

Needs the future: the tier fills ``BlockInfo.next_use`` on every add and access (the mrc replay
does so from the trace; ``inf`` = never used again). With forced insertion and unit-size blocks
MIN maximises hits under plain semantics. Ties (blocks next used by the same request) go to the
deepest block first, so under prefix semantics a parent is never evicted before a child that is
next used at the same time: it respects the prefix tree for blocks sharing a next use.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo
from kvsim.policies.priority import PriorityPolicy


class Belady(PriorityPolicy):
    name = "belady"
    needs_future = True
    respects_prefix = True

    def __init__(self) -> None:
        super().__init__()
        self._position: dict[int, int] = {}

    def add(self, key: int, info: BlockInfo) -> None:
        self._position[key] = info.position
        self._push(key, (-info.next_use, -info.position))

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._live:
            self._push(key, (-info.next_use, -info.position))

    def forget(self, key: int) -> None:
        self._position.pop(key, None)

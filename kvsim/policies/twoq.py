"""2Q (Johnson & Shasha, VLDB 1994), the simplified version, as libCacheSim sizes it.

New blocks enter A1in, a FIFO of 25 % of the tier; hits there do not promote. Blocks pushed out of
A1in leave a key in A1out (a ghost FIFO of 50 % of the tier); a block that returns while its key
is there is admitted to Am, an LRU of blocks proven to be reused. Queue sizes count pinned blocks.
Does not respect the prefix tree by construction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, check_param
from kvsim.policies.queues import QueuedPolicy


@dataclass(frozen=True)
class TwoQParams:
    a_in_size_ratio: float = 0.25
    """Share of the tier for the A1in FIFO."""
    a_out_size_ratio: float = 0.5
    """A1out ghost length as a share of the tier's size in blocks."""

    def __post_init__(self) -> None:
        check_param(0 <= self.a_in_size_ratio <= 1, "a_in_size_ratio", "must be in [0, 1]")
        check_param(0 <= self.a_out_size_ratio <= 1000, "a_out_size_ratio", "must be in [0, 1000]")


class TwoQ(QueuedPolicy):
    name = "2q"
    Params = TwoQParams

    def __init__(self, params: TwoQParams | None = None) -> None:
        super().__init__(2)  # queue 0: A1in FIFO, 1: Am LRU
        self.params = params or TwoQParams()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._in_cap = self._out_cap = 0
        self._incoming: int | None = None
        self._incoming_ghost = False
        self._pending: int | None = None

    def set_capacity(self, blocks: int) -> None:
        self._in_cap = int(blocks * self.params.a_in_size_ratio)
        self._out_cap = int(blocks * self.params.a_out_size_ratio)

    def miss(self, key: int, info: BlockInfo) -> None:
        self._incoming = key
        self._incoming_ghost = self._ghost.pop(key, 0) is None

    def add(self, key: int, info: BlockInfo) -> None:
        if self._unpin(key):
            return
        if self._incoming != key:
            self.miss(key, info)
        to_am = self._incoming_ghost
        self._incoming, self._incoming_ghost = None, False
        self._join(key, 1 if to_am else 0)

    def access(self, key: int, info: BlockInfo) -> None:
        if self._where.get(key) == 1 and key in self._q[1]:
            self._q[1].move_to_end(key)

    def forget(self, key: int) -> None:
        if self._leave(key) is None:
            return
        if self._pending == key and self._out_cap > 0:
            if len(self._ghost) >= self._out_cap:
                self._ghost.popitem(last=False)
            self._ghost[key] = None
        self._pending = None

    def victim(self) -> int:
        a_in, am = self._q
        if a_in and (len(a_in) + self._pinned[0] > self._in_cap or not am):
            key = next(iter(a_in))
            self._pending = key
            return key
        if am:
            self._pending = None
            return next(iter(am))
        raise LookupError("no evictable block")

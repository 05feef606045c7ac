"""S3-FIFO (Yang et al., SOSP 2023), with libCacheSim's parameters and eviction details.

A small FIFO (10 % of the tier) filters one-hit wonders; a block hit often enough there
(``move_to_main_threshold`` hits, libCacheSim's default 2) moves to the main FIFO, others leave a
ghost entry (ghost FIFO: 90 % of the tier's size in keys) so a quick return goes straight to main.
Main is a FIFO with reinsertion (a 2-bit clock). Until the first eviction, new blocks overflow
from a full small queue into main, as in libCacheSim.

Queue sizes count pinned blocks; only evictable blocks are chosen, and ``victim`` performs the
promotions that choosing requires (not the eviction). Does not respect the prefix tree by
construction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, check_param
from kvsim.policies.queues import QueuedPolicy


@dataclass(frozen=True)
class S3FIFOParams:
    small_size_ratio: float = 0.1
    """Share of the tier given to the small (probationary) FIFO."""
    ghost_size_ratio: float = 0.9
    """Ghost FIFO length as a share of the tier's size in blocks."""
    move_to_main_threshold: int = 2
    """Hits while in the small FIFO that promote a block to main."""

    def __post_init__(self) -> None:
        check_param(0 <= self.small_size_ratio <= 1, "small_size_ratio", "must be in [0, 1]")
        check_param(0 <= self.ghost_size_ratio <= 1000, "ghost_size_ratio", "must be in [0, 1000]")
        check_param(1 <= self.move_to_main_threshold < 2**31, "move_to_main_threshold",
                    "must be an integer in [1, 2^31)")  # fmt: skip


class S3FIFO(QueuedPolicy):
    name = "s3fifo"
    Params = S3FIFOParams

    def __init__(self, params: S3FIFOParams | None = None) -> None:
        super().__init__(2)  # queue 0: small, 1: main
        self.params = params or S3FIFOParams()
        self._freq: dict[int, int] = {}
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._small_cap = self._main_cap = self._ghost_cap = 0
        self._has_evicted = False
        self._incoming: int | None = None
        self._incoming_ghost = False
        self._pending: int | None = None  # victim chosen from small: leaves a ghost entry

    def set_capacity(self, blocks: int) -> None:
        self._small_cap = int(blocks * self.params.small_size_ratio)
        self._main_cap = blocks - self._small_cap
        self._ghost_cap = int(blocks * self.params.ghost_size_ratio)

    def miss(self, key: int, info: BlockInfo) -> None:
        self._incoming = key
        self._incoming_ghost = self._ghost.pop(key, 0) is None

    def add(self, key: int, info: BlockInfo) -> None:
        if self._unpin(key):
            return
        if self._incoming != key:
            self.miss(key, info)
        to_main = self._incoming_ghost or (
            not self._has_evicted and self._size(0) >= self._small_cap
        )
        self._incoming, self._incoming_ghost = None, False
        self._freq[key] = 0
        self._join(key, 1 if to_main else 0)

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._freq:
            self._freq[key] += 1

    def forget(self, key: int) -> None:
        if self._leave(key) is None:
            return
        self._freq.pop(key, None)
        if self._pending == key and self._ghost_cap > 0:
            ghost = self._ghost
            if key not in ghost:
                if len(ghost) >= self._ghost_cap:
                    ghost.popitem(last=False)
                ghost[key] = None
        self._pending = None

    def victim(self) -> int:
        small, main = self._q
        if not small and not main:
            raise LookupError("no evictable block")
        self._has_evicted = True
        freq, where = self._freq, self._where
        threshold = self.params.move_to_main_threshold
        while True:
            if (self._size(1) > self._main_cap or self._size(0) == 0 or not small) and main:
                while True:
                    key = next(iter(main))
                    f = freq[key]
                    if f < 1:
                        self._pending = None
                        return key
                    main.move_to_end(key)
                    freq[key] = min(f, 3) - 1
            while small:
                key = next(iter(small))
                if freq[key] >= threshold:
                    del small[key]
                    main[key] = None
                    where[key] = 1
                    freq[key] = 0
                else:
                    self._pending = key
                    return key

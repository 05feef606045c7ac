"""GreedyDual-Size-Frequency (Cherkasova 1998): size- and cost-aware with aging.

priority = L + frequency × cost / size, where L (the inflation value) becomes the priority of each
evicted block, so blocks not touched for a long time age out. cost is the block's recompute time
when the tier knows it, else 1 (then GDSF is frequency/size with aging). Does not respect the prefix
tree by construction.
"""

from __future__ import annotations

from kvsim.policies.base import BlockInfo
from kvsim.policies.priority import PriorityPolicy


class GDSF(PriorityPolicy):
    name = "gdsf"

    def __init__(self) -> None:
        super().__init__()
        self._inflation = 0.0
        # resident key -> [frequency, cost per byte, last priority]
        self._meta: dict[int, list[float]] = {}

    def _touch(self, key: int, info: BlockInfo, hit: bool) -> None:
        meta = self._meta.get(key)
        if meta is None:
            cost = info.recompute_s if info.recompute_s > 0 else 1.0
            meta = self._meta[key] = [0.0, cost / max(info.size_bytes, 1), 0.0]
        if hit or meta[0] == 0:
            meta[0] += 1
        meta[2] = self._inflation + meta[0] * meta[1]
        if hit and key not in self._live:
            return
        self._push(key, meta[2])

    def add(self, key: int, info: BlockInfo) -> None:
        self._touch(key, info, hit=False)

    def access(self, key: int, info: BlockInfo) -> None:
        self._touch(key, info, hit=True)

    def forget(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is not None:
            self._inflation = max(self._inflation, meta[2])

"""LMCache's COST_AWARE eviction: recompute-cost EWMA per byte, discounted by age.

score = EWMA(recompute cost) / bytes / (1 + age / half_life), age = now − last touch; the lowest
score goes. The cost is ``recompute_s`` when the tier knows it, else position + 1 (a deeper block
attends to more tokens). Like LMCache, it ignores prefix dependencies: does not respect the prefix
tree. Scores decay at different rates, so no heap order survives time; instead ``victim`` scores a
fixed-size random sample of evictable blocks (O(sample) per eviction, like Redis' approximated
LRU), from a seeded generator, so runs are reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, EvictionPolicy, check_param


@dataclass(frozen=True)
class LMCacheCostParams:
    ewma_weight: float = 0.5
    """Weight of the newest cost observation in the EWMA (our assumption)."""
    half_life_s: float = 60.0
    """Age at which a block's score halves (our assumption)."""
    sample: int = 32
    """Evictable blocks scored per eviction; the whole set when smaller."""
    seed: int = 0

    def __post_init__(self) -> None:
        check_param(0 <= self.ewma_weight <= 1, "ewma_weight", "must be in [0, 1]")
        check_param(0 < self.half_life_s <= 1e9, "half_life_s", "must be in (0, 1e9] seconds")
        check_param(1 <= self.sample < 2**31, "sample", "must be an integer in [1, 2^31)")


class LMCacheCost(EvictionPolicy):
    name = "lmcache-cost"
    Params = LMCacheCostParams

    def __init__(self, params: LMCacheCostParams | None = None) -> None:
        self.params = params or LMCacheCostParams()
        self._rng = random.Random(self.params.seed)
        self._keys: list[int] = []  # evictable keys, swap-removed
        self._index: dict[int, int] = {}
        self._meta: dict[int, list[float]] = {}  # key -> [cost EWMA per byte, last touch]
        self._now = 0.0
        self._chosen: int | None = None

    def _observe(self, key: int, info: BlockInfo) -> None:
        cost = (info.recompute_s if info.recompute_s > 0 else info.position + 1.0) / max(
            info.size_bytes, 1
        )
        meta = self._meta.get(key)
        if meta is None:
            self._meta[key] = [cost, info.now_s]
        else:
            w = self.params.ewma_weight
            meta[0] = w * cost + (1 - w) * meta[0]
            meta[1] = info.now_s
        self._now = max(self._now, info.now_s)
        self._chosen = None

    def add(self, key: int, info: BlockInfo) -> None:
        if key not in self._meta:
            self._observe(key, info)
        self._now = max(self._now, info.now_s)
        if key not in self._index:
            self._index[key] = len(self._keys)
            self._keys.append(key)
        self._chosen = None

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._meta:
            self._observe(key, info)

    def discard(self, key: int) -> None:
        i = self._index.pop(key, None)
        if i is None:
            return
        last = self._keys.pop()
        if last != key:
            self._keys[i] = last
            self._index[last] = i
        self._chosen = None

    def forget(self, key: int) -> None:
        self._meta.pop(key, None)

    def victim(self) -> int:
        if self._chosen is not None:
            return self._chosen
        keys = self._keys
        if not keys:
            raise LookupError("no evictable block")
        n = self.params.sample
        sample = (
            keys if len(keys) <= n else [keys[self._rng.randrange(len(keys))] for _ in range(n)]
        )
        now, half, meta = self._now, self.params.half_life_s, self._meta
        best = min(sample, key=lambda k: meta[k][0] / (1.0 + (now - meta[k][1]) / half))
        self._chosen = best
        return best

    def __len__(self) -> int:
        return len(self._keys)

"""AsymCache-style eviction (arXiv 2606.02964): hit likelihood × position-aware recompute cost.

Reconstruction (the paper's exact estimator is not public): score = L + P(hit) × cost / bytes,
evict the lowest. P(hit) is a per-block Beta estimate (hits + a) / (touches + a + b) with a, b
from ``prior``; cost is ``recompute_s`` when the tier knows it, else the prefill cost of a block at
its position, 1 + ``attention_weight`` × position (its attention spans every earlier token). L is
GDSF's inflation value — the score of the last evicted block — so idle blocks age out and no heap
order goes stale. Does not respect the prefix tree by construction: deep blocks are dear, so it
tends to keep a request's tail longer than its head, the opposite of deepest-first policies.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, check_param
from kvsim.policies.priority import PriorityPolicy


@dataclass(frozen=True)
class AsymCostParams:
    attention_weight: float = 0.05
    """Extra recompute cost per earlier block, relative to a block's own cost (our assumption)."""
    prior: tuple[float, float] = (1.0, 1.0)
    """Beta prior (a, b) of every block's hit probability."""

    def __post_init__(self) -> None:
        check_param(0 <= self.attention_weight <= 1e6, "attention_weight", "must be in [0, 1e6]")
        check_param(all(0 < x <= 1e6 for x in self.prior), "prior",
                    "must be two numbers in (0, 1e6]")  # fmt: skip


class AsymCost(PriorityPolicy):
    name = "asym-cost"
    Params = AsymCostParams

    def __init__(self, params: AsymCostParams | None = None) -> None:
        super().__init__()
        self.params = params or AsymCostParams()
        self._inflation = 0.0
        self._meta: dict[int, list[float]] = {}  # key -> [hits, touches, cost per byte, score]

    def _score(self, key: int, meta: list[float]) -> None:
        a, b = self.params.prior
        meta[3] = self._inflation + (meta[0] + a) / (meta[1] + a + b) * meta[2]
        self._push(key, meta[3])

    def add(self, key: int, info: BlockInfo) -> None:
        meta = self._meta.get(key)
        if meta is None:
            if info.recompute_s > 0:
                cost = info.recompute_s
            else:
                cost = 1.0 + self.params.attention_weight * info.position
            meta = self._meta[key] = [0.0, 1.0, cost / max(info.size_bytes, 1), 0.0]
        self._score(key, meta)

    def access(self, key: int, info: BlockInfo) -> None:
        meta = self._meta.get(key)
        if meta is None:
            return
        meta[0] += 1
        meta[1] += 1
        if key in self._live:
            self._score(key, meta)

    def forget(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is not None:
            self._inflation = max(self._inflation, meta[3])

"""Round-robin: each candidate set is served in turn (every serving engine has one; Vidur's
`scheduler/global_scheduler/round_robin_global_scheduler.py`).

The turn is kept per candidate set, so under P/D the decode and prefill pools each rotate on
their own instead of sharing one counter (which, with two pools of even size, would send every
request to the same decode replica). No parameters.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from kvsim.routers.base import ClusterView, Router, RouteRequest


class RoundRobin(Router):
    """The next candidate after the one this candidate set got last."""

    name = "round-robin"

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(params, rng)
        self._turn: dict[tuple[int, ...], int] = {}

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        key = tuple(candidates)
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        return candidates[turn % len(candidates)]

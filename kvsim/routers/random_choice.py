"""Random: a candidate drawn uniformly with the run's seeded generator (everyone has one: SGLang
router `random`, Vidur `scheduler/global_scheduler/random_global_scheduler.py`). No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.routers.base import ClusterView, Router, RouteRequest


class RandomRouter(Router):
    """Uniform over the candidates; the same seed gives the same choices."""

    name = "random"

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        return candidates[self.rng.randrange(len(candidates))]

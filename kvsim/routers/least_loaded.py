"""Least outstanding requests: Vidur `scheduler/global_scheduler/lor_global_scheduler.py`.

Load = outstanding requests on the replica, waiting + running (`ReplicaLoad.active`). Ties go to
the lowest replica index, as Vidur's `min` over replicas in id order does, so the rule is
deterministic without drawing from the generator. (LLMServingSim's `LOAD` weighs waiting four
times; that variant is not built in.) No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.routers.base import ClusterView, Router, RouteRequest


class LeastLoaded(Router):
    """Fewest waiting + running requests; lowest index on a tie."""

    name = "least-loaded"

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        return least_active(view, candidates)


def least_active(view: ClusterView, candidates: Sequence[int]) -> int:
    """The candidate with the fewest waiting + running requests, lowest index on a tie."""
    loads = view.loads
    best = -1
    best_load = -1
    for w in candidates:
        load = loads[w]
        active = load.waiting + load.running
        if best < 0 or active < best_load or (active == best_load and w < best):
            best, best_load = w, active
    return best

"""Power of two choices: SGLang router `power_of_two` (`sgl-router/src/policies/power_of_two.rs`).

Two distinct candidates are drawn uniformly with the run's seeded generator and the one with
fewer active requests (waiting + running) wins; on a tie the first drawn wins, as SGLang's
`if load1 <= load2` does. A single candidate is returned without drawing. No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.routers.base import ClusterView, Router, RouteRequest


class PowerOfTwo(Router):
    """The less loaded of two distinct random candidates."""

    name = "power-of-two"

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i = self.rng.randrange(n)
        j = self.rng.randrange(n - 1)
        if j >= i:  # two distinct positions without building a sample
            j += 1
        a, b = candidates[i], candidates[j]
        la, lb = view.loads[a], view.loads[b]
        return a if la.waiting + la.running <= lb.waiting + lb.running else b

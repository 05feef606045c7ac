"""Power of two choices, as SGLang's router has it now: smg-project/smg (SGLang's graduated model
gateway) `model_gateway/src/policies/power_of_two.rs` at commit f8daa8835a8b (2026-08-22), which
scores the pair with the least-load policy's expected wait (`policies/least_load.rs`).

Two distinct candidates are drawn uniformly with the run's seeded generator (first i, then
(i + 1 + a draw below n − 1) mod n, as SMG does) and the one with the lower

    score_w = prefill_tokens_w / `default_throughput` + `kv_pressure_weight` · k_w / (1 − k_w)

wins, k_w = the replica's HBM usage clipped to [0, 0.999]; a tie is a fair coin. The first term
is the replica's prompt work left, in seconds at the drain rate; the second a barrier that grows
without bound as the cache fills. SMG divides by each backend's reported generation rate,
falling back to 2,000 tokens/s; kvsim's replicas of one run are alike, so one rate serves all
(assumption). SMG's queued tokens count the waiting queue's uncached prompt tokens; kvsim's
`prefill_tokens` also counts the prompt being computed. SMG adds the tokens it dispatched since
its last load poll to correct stale loads; with `--router-refresh-s` 0 the view is live and that
correction is zero, so it is not modelled. A single candidate is returned without drawing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvsim.routers.base import ClusterView, ReplicaLoad, Router, RouteRequest, check_param


@dataclass(frozen=True)
class PowerOfTwoParams:
    # smg-project/smg@f8daa8835a8b4419b53125a837aaab2b3ce895c3 model_gateway/src/policies/
    # least_load.rs: DEFAULT_KV_PRESSURE_WEIGHT = 0.15 (seconds), DEFAULT_THROUGHPUT = 2000.0
    kv_pressure_weight: float = 0.15
    """Seconds the KV barrier k/(1 − k) is worth per unit."""
    default_throughput: float = 2000.0
    """Tokens per second at which a replica drains its prompt work."""

    def __post_init__(self) -> None:
        check_param(self.kv_pressure_weight >= 0, "kv_pressure_weight", "must be >= 0")
        check_param(self.default_throughput > 0, "default_throughput", "must be > 0")


class PowerOfTwo(Router):
    """The lower expected wait of two distinct random candidates."""

    name = "power-of-two"
    Params = PowerOfTwoParams

    def score(self, load: ReplicaLoad) -> float:
        """Expected wait in seconds: prompt work left plus the KV-pressure barrier."""
        p: PowerOfTwoParams = self.params
        k = min(max(load.kv_usage, 0.0), 0.999)
        return load.prefill_tokens / p.default_throughput + p.kv_pressure_weight * k / (1.0 - k)

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i = self.rng.randrange(n)
        j = (i + 1 + self.rng.randrange(n - 1)) % n
        a, b = candidates[i], candidates[j]
        sa, sb = self.score(view.loads[a]), self.score(view.loads[b])
        if sa == sb:
            return b if self.rng.randrange(2) == 0 else a
        return a if sa < sb else b

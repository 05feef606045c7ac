"""Where the trace's reuse went: per request, the reuse an infinite cache would give, split
into what the run captured and what it lost to routing, to eviction and to stale snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from kvsim.kvcache.request import Request
from kvsim.routers import PrefixMatch, RouteRequest

ATTRIBUTION_KEYS = (
    "ceiling",
    "captured",
    "lost_to_routing",
    "lost_to_eviction",
    "lost_to_staleness",
)


class LiveMatches(Protocol):
    """What attribution reads of a cluster: each replica's live cached prefix of a request."""

    @property
    def replicas(self) -> Sequence[object]: ...

    def live_match(self, replica: int, request: RouteRequest) -> PrefixMatch: ...


class Attribution:
    """Per request, in blocks: the reuse one infinite cache would give (the ceiling: requests in
    the trace's arrival order, as `kvsim trace stats` counts it), the best
    any replica held when the request was routed, what the chosen replica held, and what the
    replica held that the same router would have chosen from live state (a shadow router run
    beside a stale one). Turned into token shares once the run is over:

        lost to eviction  = ceiling - best (no cache in the cluster still held it)
        lost to routing   = best - chosen (another replica held it)
          of which stale  = exact - chosen, where the exact router would have found it
    with `captured` (the hit the request really got, at admission) in place of `chosen` where
    the two differ, so that the four shares always sum to the ceiling."""

    def __init__(self, ceiling_blocks: np.ndarray) -> None:
        n = len(ceiling_blocks)
        self.ceiling = ceiling_blocks
        self.best = np.zeros(n, dtype=np.int64)
        self.chosen = np.zeros(n, dtype=np.int64)
        self.exact = np.zeros(n, dtype=np.int64)  # what an exact-state router's pick held
        self.last_of_session: dict[int, int] = {}

    def record(
        self,
        req: Request,
        route: RouteRequest,
        view: LiveMatches,
        chosen: int,
        usable: int,
        exact_choice: int | None = None,
    ) -> None:
        """`exact_choice`: where the same router, seeing live state, would have sent it (only
        when the real one sees snapshots)."""
        i = req.index
        ceiling = int(self.ceiling[i])
        a = min(view.live_match(chosen, route).blocks, usable)
        best = a
        if best < ceiling:
            # the replica that served the session last is the likeliest holder: look there first
            last = self.last_of_session.get(route.session_id)
            if last is not None:
                best = max(best, min(view.live_match(last, route).blocks, usable))
            for r in range(len(view.replicas)):
                if best >= ceiling:
                    break
                best = max(best, min(view.live_match(r, route).blocks, usable))
        self.last_of_session[route.session_id] = chosen
        self.best[i] = best
        self.chosen[i] = a
        self.exact[i] = (
            a if exact_choice is None else min(view.live_match(exact_choice, route).blocks, usable)
        )

    def shares(
        self,
        captured_blocks: np.ndarray,
        done: np.ndarray,
        input_tokens: np.ndarray,
        block_size: int,
    ) -> dict[str, float]:
        """`hit_attribution`: the ceiling split four ways, each a share of input tokens."""
        x = captured_blocks[done]
        ceiling = np.maximum(self.ceiling[done], x)
        lost_route = np.clip(self.best[done] - self.chosen[done], 0, ceiling - x)
        exact = np.minimum(self.exact[done], self.best[done])
        stale = np.clip(exact - self.chosen[done], 0, lost_route)
        total = int(input_tokens[done].sum())
        if not total:
            return dict.fromkeys(ATTRIBUTION_KEYS, 0.0)
        scale = block_size / total
        return {
            "ceiling": float(ceiling.sum() * scale),
            "captured": float(x.sum() * scale),
            "lost_to_routing": float((lost_route - stale).sum() * scale),
            "lost_to_eviction": float((ceiling - x - lost_route).sum() * scale),
            "lost_to_staleness": float(stale.sum() * scale),
        }

"""Mooncake's cache-aware load balancing (Mooncake, FAST'25, §5): send the request where its
estimated time to first token is lowest. The open-source conductor only indexes; the scheduler is
described in the paper, so this follows the paper.

For each candidate w, with match_w = `view.match(w, request)` (the request's leading blocks held
by w, per tier) and B the block size:

    cached_w   = min(match_w.blocks · B, input_tokens − 1)   (at least one token is computed)
    ttft_w     = queue_s(w) + prefill_s(w, input_tokens − cached_w, cached_w) + load_s(w, match_w)

queueing, prefill of the uncached part and the move of the cached prefix below HBM into HBM, all
priced by the cluster's cost model through the view. Lowest estimate wins, lowest index on a tie.
The paper's replication of hot prefixes is the cache's business, not the router's. No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsim.routers.base import ClusterView, Router, RouteRequest


class MinTtft(Router):
    """Lowest queueing + uncached prefill + prefix load time."""

    name = "min-ttft"

    def estimate_s(self, request: RouteRequest, view: ClusterView, replica: int) -> float:
        """Estimated TTFT of `request` on `replica`."""
        match = view.match(replica, request)
        cached = max(0, min(match.blocks * request.block_size, request.input_tokens - 1))
        return (
            view.queue_s(replica)
            + view.prefill_s(replica, request.input_tokens - cached, cached)
            + view.load_s(replica, match)
        )

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        best, best_s = candidates[0], float("inf")
        for w in candidates:
            est = self.estimate_s(request, view, w)
            if est < best_s or (est == best_s and w < best):
                best, best_s = w, est
        return best

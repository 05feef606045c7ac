"""SGLang's router `cache_aware`, as its current home, Shepherd Model Gateway (SMG, which
graduated from sgl-project/sglang's `sgl-model-gateway/`), has it: smg-project/smg
`model_gateway/src/policies/cache_aware.rs` at commit f8daa8835a8b (2026-08-22), the approximate
token-tree path (gRPC workers without KV events: the router learns only from its own decisions).
Defaults are those `smg launch` ships (`bindings/python/src/smg/router_args.py`), not the
library's `CacheAwareConfig::default()`; docs/routers.md compares the two and kvsim's old ones.

Load = waiting + running requests of each candidate (SMG's per-worker in-flight count).
The least-loaded candidate is the lowest (load, requests routed there so far, index), SMG's
min-load key. One tree serves every replica: per replica, the set of request hash chains routed
there (`BlockIndex`; a chain hash stands for its whole prefix), a node per block.

1. Fleet-wide KV pressure (both off at 1.0): if the highest HBM usage > `overload_token_usage_
   threshold`, or highest − lowest > `balance_token_usage_threshold`, the least-loaded candidate.
2. Otherwise m_w = leading request blocks in w's tree and rate = max m_w · B / input_tokens
   (the tree is page-aligned; the denominator counts every prompt token).
   - rate > `cache_threshold` = 0.3: among the candidates holding that longest match (the
     tenants of the deepest matched node), the least loaded, ties uniformly at random; then
     the per-request gate: if its load > `balance_rel_threshold` = 1.5 × the mean load of the
     candidates **and** > mean + `balance_abs_threshold` = 64, the least-loaded candidate instead.
   - else the least-loaded candidate.

The chosen replica's tree always receives the request's blocks, stamped with the simulated time.
Every `eviction_interval_s` = 60 s of simulated time (checked when a request is routed) the tree
is cut, least recently routed block first across all replicas, until the blocks of all replicas
together hold at most `max_tree_size` = 2^26 tokens (SMG counts tokens on the gRPC path and
characters on the HTTP path, tree-wide, not per worker).

Not modelled: SMG's cap of 8 tenants per matched node, the event-driven path (KV events) and the
hash index (`cache_index = hash`); both are off by default.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.routers.base import ClusterView, Router, RouteRequest, check_param
from kvsim.routers.prefix_index import BlockIndex

# Source of every default below: smg-project/smg@f8daa8835a8b4419b53125a837aaab2b3ce895c3,
# bindings/python/src/smg/router_args.py (RouterArgs, what `smg launch` uses).


@dataclass(frozen=True)
class SglangCacheAwareParams:
    cache_threshold: float = 0.3  # router_args.py: cache_threshold = 0.3
    """Share of the prompt's tokens the longest match must exceed to route by cache."""
    balance_abs_threshold: int = 64  # router_args.py: balance_abs_threshold = 64
    """Requests above the mean load the chosen holder must exceed (with the relative test) to
    be passed over for the least loaded."""
    balance_rel_threshold: float = 1.5  # router_args.py: balance_rel_threshold = 1.5
    """Multiple of the mean load the chosen holder must also exceed."""
    balance_token_usage_threshold: float = 1.0  # router_args.py: 1.0 (off)
    """HBM-usage spread (max − min) above which cache is ignored for the least loaded."""
    overload_token_usage_threshold: float = 1.0  # router_args.py: 1.0 (off)
    """HBM usage of the fullest replica above which cache is ignored for the least loaded."""
    eviction_interval_s: float = 60.0  # router_args.py: eviction_interval_secs = 60
    """Simulated seconds between tree trims (the Rust binary's flag defaults to 120)."""
    max_tree_size: int = 2**26  # router_args.py: max_tree_size = 2**26
    """Tokens the whole tree keeps at a trim, summed over all replicas."""

    def __post_init__(self) -> None:
        check_param(
            0.0 <= self.cache_threshold <= 1.0, "cache_threshold", "must be between 0 and 1"
        )
        check_param(self.balance_abs_threshold >= 0, "balance_abs_threshold", "must be >= 0")
        check_param(self.balance_rel_threshold >= 0, "balance_rel_threshold", "must be >= 0")
        for field in ("balance_token_usage_threshold", "overload_token_usage_threshold"):
            check_param(getattr(self, field) >= 0, field, "must be >= 0")
        check_param(self.eviction_interval_s > 0, "eviction_interval_s", "must be > 0")
        check_param(self.max_tree_size >= 0, "max_tree_size", "must be >= 0")


class SglangCacheAware(Router):
    """Longest approximate prefix match, least loaded among its holders, unless that holder is
    far above the mean load; least loaded when nothing matches enough."""

    name = "sglang-cache-aware"
    Params = SglangCacheAwareParams

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(params, rng)
        self.trees: dict[int, BlockIndex] = {}  # replica -> blocks routed there
        self.routed: dict[int, int] = {}  # replica -> requests routed there (min-load tie key)
        self._next_trim_s: float = self.params.eviction_interval_s

    def tree(self, replica: int) -> BlockIndex:
        """The router's tree for `replica` (created empty on first use)."""
        tree = self.trees.get(replica)
        if tree is None:
            tree = self.trees[replica] = BlockIndex()
        return tree

    def least_loaded(self, view: ClusterView, candidates: Sequence[int]) -> int:
        """SMG's min-load worker: lowest (load, requests routed there, index)."""
        loads = view.loads
        routed = self.routed
        return min(
            candidates,
            key=lambda w: (loads[w].waiting + loads[w].running, routed.get(w, 0), w),
        )

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        p: SglangCacheAwareParams = self.params
        now_s = view.now_s
        if now_s >= self._next_trim_s:
            self.trim(p.max_tree_size, request.block_size)
            self._next_trim_s = now_s + p.eviction_interval_s
        if self._kv_pressure(view, candidates):
            w = self.least_loaded(view, candidates)
        else:
            w = self._by_cache(request, view, candidates)
        self.tree(w).insert(request.hashes, now_s)
        self.routed[w] = self.routed.get(w, 0) + 1
        return w

    def _kv_pressure(self, view: ClusterView, candidates: Sequence[int]) -> bool:
        """SMG's `is_kv_imbalanced`: a replica too full, or usage too uneven."""
        p: SglangCacheAwareParams = self.params
        if p.overload_token_usage_threshold >= 1.0 and p.balance_token_usage_threshold >= 1.0:
            return False  # usage is at most 1: neither test can fire
        usage = [view.loads[w].kv_usage for w in candidates]
        high, low = max(usage), min(usage)
        return (
            high > p.overload_token_usage_threshold or high - low > p.balance_token_usage_threshold
        )

    def _by_cache(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        """The least-loaded holder of the longest match if it covers enough of the prompt and
        passes the load gate; else the least-loaded candidate."""
        p: SglangCacheAwareParams = self.params
        hashes = request.hashes
        matched: list[int] = []
        for w in candidates:
            tree = self.trees.get(w)
            matched.append(tree.match(hashes) if tree is not None else 0)
        best = max(matched)
        tokens = request.input_tokens
        if not tokens or best * request.block_size / tokens <= p.cache_threshold:
            return self.least_loaded(view, candidates)
        loads = view.loads
        active = {w: loads[w].waiting + loads[w].running for w in candidates}
        holders = [w for w, m in zip(candidates, matched, strict=True) if m == best]
        fewest = min(active[w] for w in holders)
        tied = [w for w in holders if active[w] == fewest]
        w = tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]
        mean = sum(active.values()) / len(candidates)
        load = active[w]
        if load > p.balance_rel_threshold * mean and load > mean + p.balance_abs_threshold:
            return self.least_loaded(view, candidates)
        return w

    def trim(self, max_tokens: int, block_size: int) -> int:
        """Drop the least recently routed blocks, across every replica's tree, until all trees
        together hold at most `max_tokens` tokens; how many blocks went. Ties in routing time go
        to the lowest replica first."""
        keep = max_tokens // block_size
        over = sum(len(t) for t in self.trees.values()) - keep
        if over <= 0:
            return 0
        heap: list[tuple[float, int]] = []
        for w, tree in self.trees.items():
            oldest = tree.oldest_s()
            if oldest is not None:
                heap.append((oldest, w))
        heapq.heapify(heap)
        for _ in range(over):
            _, w = heapq.heappop(heap)
            tree = self.trees[w]
            tree.pop_oldest()
            oldest = tree.oldest_s()
            if oldest is not None:
                heapq.heappush(heap, (oldest, w))
        return over

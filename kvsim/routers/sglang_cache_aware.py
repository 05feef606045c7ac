"""SGLang router `cache_aware`: `sgl-router/src/policies/cache_aware.rs`, defaults in
`sgl-router/src/policies/mod.rs`. Rule as in shared/reference/routing.md.

Load = waiting + running requests of each candidate.

1. Imbalanced (max_load − min_load > `balance_abs_threshold` = 32 **and** max_load >
   `balance_rel_threshold` = 1.1 × min_load): the least loaded candidate (lowest index on a tie,
   as Rust's `min_by_key` keeps the first).
2. Otherwise match = matched blocks / request blocks on the router's own approximate tree of
   each candidate; if the best match > `cache_threshold` = 0.5, the candidate with the longest
   match, else the candidate with the smallest tree (lowest index on either tie).

The chosen replica's tree always receives the request's blocks, in both cases, stamped with the
simulated time. The trees ignore `view.match`: SGLang's router sees only its own traffic.

Where SGLang keeps one radix tree of prompt characters shared by all workers, we keep per replica
the set of the request hash chains it routed there (`BlockIndex`: a chain hash stands for its
whole prefix, so the set is a trie of blocks); a node is a block and sizes count blocks, not
characters. Every `eviction_interval_s` = 30 s of simulated time (checked when a request is
routed, as there is no background thread in a simulation) each tree is cut to `max_tree_size` =
10,000 nodes by LRU, deepest blocks of a chain first.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.routers.base import ClusterView, Router, RouteRequest, check_param
from kvsim.routers.prefix_index import BlockIndex


@dataclass(frozen=True)
class SglangCacheAwareParams:
    balance_abs_threshold: int = 32
    """Load gap (requests) beyond which, with the relative test, balance beats cache."""
    balance_rel_threshold: float = 1.1
    """Max load must also exceed this multiple of min load to count as imbalanced."""
    cache_threshold: float = 0.5
    """Match ratio above which the longest match wins; else the smallest tree."""
    eviction_interval_s: float = 30.0
    """Simulated seconds between tree trims."""
    max_tree_size: int = 10000
    """Nodes (blocks) each replica's tree keeps at a trim."""

    def __post_init__(self) -> None:
        check_param(self.balance_abs_threshold >= 0, "balance_abs_threshold", "must be >= 0")
        check_param(self.balance_rel_threshold >= 0, "balance_rel_threshold", "must be >= 0")
        check_param(
            0.0 <= self.cache_threshold <= 1.0, "cache_threshold", "must be between 0 and 1"
        )
        check_param(self.eviction_interval_s > 0, "eviction_interval_s", "must be > 0")
        check_param(self.max_tree_size >= 0, "max_tree_size", "must be >= 0")


class SglangCacheAware(Router):
    """Cache affinity from the router's own trees unless the load is badly imbalanced."""

    name = "sglang-cache-aware"
    Params = SglangCacheAwareParams

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(params, rng)
        self.trees: dict[int, BlockIndex] = {}  # replica -> blocks routed there
        self._next_trim_s: float = self.params.eviction_interval_s

    def tree(self, replica: int) -> BlockIndex:
        """The router's tree for `replica` (created empty on first use)."""
        tree = self.trees.get(replica)
        if tree is None:
            tree = self.trees[replica] = BlockIndex()
        return tree

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        p: SglangCacheAwareParams = self.params
        now_s = view.now_s
        if now_s >= self._next_trim_s:
            for tree in self.trees.values():
                tree.trim(p.max_tree_size)
            self._next_trim_s = now_s + p.eviction_interval_s
        loads = view.loads
        low = high = -1
        low_load = high_load = 0
        for w in candidates:
            load = loads[w]
            active = load.waiting + load.running
            if low < 0 or active < low_load:
                low, low_load = w, active
            if high < 0 or active > high_load:
                high, high_load = w, active
        if (
            high_load - low_load > p.balance_abs_threshold
            and high_load > p.balance_rel_threshold * low_load
        ):
            w = low
        else:
            w = self._by_cache(request, candidates)
        self.tree(w).insert(request.hashes, now_s)
        return w

    def _by_cache(self, request: RouteRequest, candidates: Sequence[int]) -> int:
        """Longest match if its ratio beats the threshold, else the smallest tree."""
        hashes = request.hashes
        best, best_matched = candidates[0], -1
        smallest, smallest_size = candidates[0], -1
        for w in candidates:
            tree = self.trees.get(w)
            matched = tree.match(hashes) if tree is not None else 0
            size = len(tree) if tree is not None else 0
            if matched > best_matched:
                best, best_matched = w, matched
            if smallest_size < 0 or size < smallest_size:
                smallest, smallest_size = w, size
        if len(hashes) and best_matched / len(hashes) > self.params.cache_threshold:
            return best
        return smallest

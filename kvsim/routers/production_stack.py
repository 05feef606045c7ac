"""vLLM production-stack's KV-aware routers: vllm-project/production-stack
`src/vllm_router/routers/routing_logic.py` at commit a6c01db05f65 (2026-08-05), defaults from
`src/vllm_router/parsers/parser.py` there. `mode` picks one.

Load = waiting + running requests of each candidate; m_w = the request's leading blocks matched.

- `prefixaware` (default): the candidate whose router-local trie holds the longest prefix of the
  request, ties uniformly at random with the run's generator (production-stack draws
  `random.choice` among the endpoints sharing the longest match, so with nothing matched the
  choice is uniform). The chosen replica's trie then receives the request's blocks.
- `loadaware` (kvsim's own variant, not production-stack's: its `--routing-logic` offers
  roundrobin, session, kvaware, prefixaware and the two disaggregated ones, and no commit in its
  history has a load-aware prefix router): the highest m_w / request blocks − β · (load_w −
  mean) / max(1, mean), mean over the candidates, m_w from the same trie, β = `beta` = 1; ties
  uniformly at random; the chosen replica's trie receives the request's blocks.
- `kvaware`: a replica qualifies when its cache (any tier, `view.match`: the LMCache holder in
  production-stack) covers m_w · B ≥ input_tokens − `kv_threshold_tokens` (2000); the qualifying
  replica with the most matched blocks wins (fewest active, then lowest index, on a tie). With no
  qualifier, the least loaded (lowest index on a tie). Short prompts (≤ 2000 tokens) qualify
  everywhere, so they go to the best holder, or by load when nobody holds any.

Where kvsim differs from that source: production-stack's trie hashes 128-character chunks of the
prompt text, kvsim's matches blocks; `prefixaware` with `--prefix-min-match-length` 0 (its
default) never falls back, as here. `kvaware` asks LMCache for the instance holding the prompt
and takes the first it names (kvsim: the most matched blocks); with no qualifier it hashes the
session header when one is configured, else takes the endpoint with the lowest request rate
(kvsim: the fewest active requests, a stand-in for the rate).

The trie is a set of the hash chains routed to each replica (`BlockIndex`; a chain hash stands for
its whole prefix), unbounded as production-stack's is unless `max_trie_blocks` > 0 caps it by LRU.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.routers.base import ClusterView, Router, RouteRequest, check_param
from kvsim.routers.least_loaded import least_active
from kvsim.routers.prefix_index import BlockIndex

MODES = ("prefixaware", "loadaware", "kvaware")


@dataclass(frozen=True)
class ProductionStackParams:
    mode: str = "prefixaware"  # parser.py: --routing-logic has no default
    """prefixaware, loadaware or kvaware."""
    beta: float = 1.0  # kvsim variant (no production-stack source)
    """loadaware: weight of the load's deviation from the mean."""
    kv_threshold_tokens: int = 2000  # parser.py: --kv-aware-threshold default 2000
    """kvaware: a replica holding all but this many prompt tokens is preferred."""
    max_trie_blocks: int = 0  # routing_logic.py PrefixAwareRouter: no eviction
    """prefixaware/loadaware: blocks each replica's trie keeps (LRU); 0 = unbounded."""

    def __post_init__(self) -> None:
        check_param(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}")
        check_param(self.beta >= 0, "beta", "must be >= 0")
        check_param(self.kv_threshold_tokens >= 0, "kv_threshold_tokens", "must be >= 0")
        check_param(self.max_trie_blocks >= 0, "max_trie_blocks", "must be >= 0")


class ProductionStack(Router):
    """Prefix-trie, load-adjusted prefix or LMCache-holder routing."""

    name = "production-stack"
    Params = ProductionStackParams

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(params, rng)
        self.tries: dict[int, BlockIndex] = {}  # replica -> blocks routed there

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        mode = self.params.mode
        if mode == "kvaware":
            return self._kvaware(request, view, candidates)
        scores = (
            self._matched(request, candidates)
            if mode == "prefixaware"
            else self.loadaware_scores(request, view, candidates)
        )
        high = max(scores)
        tied = [i for i, s in enumerate(scores) if s == high]
        w = candidates[tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]]
        trie = self.tries.get(w)
        if trie is None:
            trie = self.tries[w] = BlockIndex()
        trie.insert(request.hashes, view.now_s)
        if self.params.max_trie_blocks:
            trie.trim(self.params.max_trie_blocks)
        return w

    def _matched(self, request: RouteRequest, candidates: Sequence[int]) -> list[int]:
        """Leading request blocks in each candidate's trie, in candidate order."""
        out: list[int] = []
        for w in candidates:
            trie = self.tries.get(w)
            out.append(trie.match(request.hashes) if trie is not None else 0)
        return out

    def loadaware_scores(
        self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]
    ) -> list[float]:
        """m_w / blocks − β · (load_w − mean) / max(1, mean) per candidate."""
        loads = view.loads
        active = [loads[w].waiting + loads[w].running for w in candidates]
        mean = sum(active) / len(active)
        spread = max(1.0, mean)
        total = len(request.hashes)
        beta = self.params.beta
        return [
            (m / total if total else 0.0) - beta * (a - mean) / spread
            for m, a in zip(self._matched(request, candidates), active, strict=True)
        ]

    def _kvaware(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        loads = view.loads
        need_tokens = request.input_tokens - self.params.kv_threshold_tokens
        best, best_blocks, best_active = -1, -1, 0
        for w in candidates:
            blocks = view.match(w, request).blocks
            if blocks * request.block_size < need_tokens:
                continue
            active = loads[w].waiting + loads[w].running
            if blocks > best_blocks or (blocks == best_blocks and active < best_active):
                best, best_blocks, best_active = w, blocks, active
        return best if best >= 0 else least_active(view, candidates)

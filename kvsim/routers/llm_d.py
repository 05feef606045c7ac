"""llm-d inference scheduler (EPP): `pkg/epp/scheduling/scheduler_profile.go` (weighted sum of
scorers, max wins), `kvblock_scorer.go` (precise prefix scorer); P/D from
`deploy/config/pd-epp-config.yaml`. Formulas as in shared/reference/routing.md.

Each candidate w scores S_w = Σ_i weight_i · clip01(s_i(w)); the highest wins and ties are broken
uniformly at random with the run's generator (llm-d shuffles the pods before its max picker).
The precise-prefix configuration's scorers and weights are the defaults:

- prefix (weight 2): raw_w = gpu · device_w + cpu · host_w + disk · disk_w + shared · shared_w
  over the request's consecutive leading blocks cached on w (`view.match`), with tier weights
  gpu 1.0 and cpu 0.8 (llm-d's); disk and shared are 0 (llm-d's indexer sees no such tier) unless
  set. s = min(1, raw_w / total blocks), total = the request's full blocks (`len(hashes)`), the
  blocks llm-d hashes.
- queue (weight 1): (maxQ − q_w)/(maxQ − minQ) over the candidates, q = waiting requests; 1 when
  every q is equal.
- kv-utilization (weight 1): 1 − kv_usage_w.
- load-aware (weight 0, off in this config): 0.5 at an empty queue falling linearly to 0 at 128.

`approximate=True` swaps the precise scorer for the approximate prefix scorer: matched blocks /
total blocks from a per-replica LRU of the blocks of requests it routed there (the first
`max_prefix_blocks` = 256 blocks of a request), ignoring `view.match`. The LRU holds
`lru_capacity_blocks` per replica; its default 0 is the plugin's `autoTune: true`, under which
llm-d sizes each server's LRU to the HBM blocks the server reports, so kvsim uses the replica's
`capacity_blocks` (31,250, the plugin's fallback, only when auto-tuning is off).

Sources, llm-d/llm-d-inference-scheduler at commit 520af47896e5 (2026-05-17): weights in
`deploy/config/epp-precise-prefix-cache-config.yaml` (prefix 2, kv-cache-utilization 1, queue 1)
and `deploy/config/pd-epp-config.yaml` (nonCachedTokens 16; prefill profile prefix 2, queue 1);
approximate-prefix defaults in `pkg/epp/framework/plugins/requestcontrol/dataproducer/
approximateprefix/types.go` (defaultConfig: autoTune true, 16-token blocks, 256 blocks,
31,250 per server); load-aware threshold 128 in `.../scheduling/scorer/loadaware/load_aware.go`;
tier weights gpu 1.0, cpu 0.8 in llm-d/llm-d-kv-cache v0.8.0 (the version its go.mod pins),
`pkg/kvcache/backend.go`. Under P/D, pd-epp-config's decode profile scores prefix 2 + queue 1
without kv-utilization; kvsim's `choose` keeps kv-utilization 1 (set
`kv_utilization_weight=0` to match it).

P/D is decode-first: the cluster calls `choose` for the decode replica, disaggregates when the
request's tokens not cached there are at least `pd_threshold_tokens` = 16, and then calls
`choose_prefill`, which scores 2 · prefix + 1 · queue.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.routers.base import ClusterView, Router, RouteRequest, check_param
from kvsim.routers.prefix_index import BlockIndex


@dataclass(frozen=True)
class LlmDParams:
    # Defaults: llm-d/llm-d-inference-scheduler@520af47896e5, files named in the docstring.
    prefix_weight: float = 2.0  # epp-precise-prefix-cache-config.yaml: weight 2.0
    """Weight of the prefix scorer when choosing a (decode or aggregated) replica."""
    queue_weight: float = 1.0  # epp-precise-prefix-cache-config.yaml: weight 1.0
    """Weight of the queue scorer."""
    kv_utilization_weight: float = 1.0  # epp-precise-prefix-cache-config.yaml: weight 1.0
    """Weight of the kv-utilization scorer (1 − HBM usage)."""
    load_aware_weight: float = 0.0  # not in epp-precise-prefix-cache-config.yaml
    """Weight of the load-aware scorer (off in the precise-prefix config)."""
    load_aware_queue_threshold: int = 128  # load_aware.go: QueueThresholdDefault = 128
    """Queue length at which the load-aware score reaches 0."""
    prefill_prefix_weight: float = 2.0  # pd-epp-config.yaml, prefill profile: weight 2
    """P/D: weight of the prefix scorer when choosing the prefill replica."""
    prefill_queue_weight: float = 1.0  # pd-epp-config.yaml, prefill profile: weight 1
    """P/D: weight of the queue scorer when choosing the prefill replica."""
    gpu_tier_weight: float = 1.0  # llm-d-kv-cache@v0.8.0 pkg/kvcache/backend.go: gpu 1.0
    """Prefix credit of a block in HBM."""
    cpu_tier_weight: float = 0.8  # llm-d-kv-cache@v0.8.0 pkg/kvcache/backend.go: cpu 0.8
    """Prefix credit of a block in node memory."""
    disk_tier_weight: float = 0.0  # backend.go@v0.8.0 has no storage tier
    """Prefix credit of a block on node storage (llm-d does not index it)."""
    shared_tier_weight: float = 0.0  # backend.go@v0.8.0 has no shared tier
    """Prefix credit of a block in the shared pool (llm-d does not index it)."""
    approximate: bool = False
    """Use the approximate prefix scorer (own routing decisions) instead of KV events."""
    lru_capacity_blocks: int = 0  # types.go defaultConfig AutoTune: true (plugin.go makeserver)
    """Approximate scorer: blocks remembered per replica (LRU); 0 = the replica's HBM blocks."""
    max_prefix_blocks: int = 256  # approximateprefix/types.go: defaultMaxPrefixBlocks = 256
    """Approximate scorer: leading blocks of a request it hashes and matches."""
    pd_threshold_tokens: int = 16  # pd-epp-config.yaml: nonCachedTokens 16
    """P/D: disaggregate when at least this many prompt tokens are not cached on the decode
    replica."""

    def __post_init__(self) -> None:
        for field in (
            "prefix_weight",
            "queue_weight",
            "kv_utilization_weight",
            "load_aware_weight",
            "prefill_prefix_weight",
            "prefill_queue_weight",
            "gpu_tier_weight",
            "cpu_tier_weight",
            "disk_tier_weight",
            "shared_tier_weight",
        ):
            check_param(getattr(self, field) >= 0, field, "must be >= 0")
        check_param(
            self.load_aware_queue_threshold >= 1, "load_aware_queue_threshold", "must be >= 1"
        )
        check_param(self.lru_capacity_blocks >= 0, "lru_capacity_blocks", "must be >= 0")
        check_param(self.max_prefix_blocks >= 1, "max_prefix_blocks", "must be >= 1")
        check_param(self.pd_threshold_tokens >= 0, "pd_threshold_tokens", "must be >= 0")


class LlmD(Router):
    """Highest weighted sum of prefix, queue and kv-utilization scores."""

    name = "llm-d"
    Params = LlmDParams
    pd_threshold_tokens: int | None = 16

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(params, rng)
        self.pd_threshold_tokens = self.params.pd_threshold_tokens
        self._seen: dict[int, BlockIndex] = {}  # approximate mode: replica -> routed blocks

    def prefix_score(self, request: RouteRequest, view: ClusterView, replica: int) -> float:
        """The prefix scorer's clipped score for one replica."""
        p: LlmDParams = self.params
        if p.approximate:
            total = min(len(request.hashes), p.max_prefix_blocks)
            if not total:
                return 0.0
            index = self._seen.get(replica)
            if index is None:
                return 0.0
            return index.match(request.hashes, p.max_prefix_blocks) / total
        total = len(request.hashes)
        if not total:
            return 0.0
        m = view.match(replica, request)
        raw = (
            p.gpu_tier_weight * m.device
            + p.cpu_tier_weight * m.host
            + p.disk_tier_weight * m.disk
            + p.shared_tier_weight * m.shared
        )
        return min(1.0, raw / total)

    def scores(
        self,
        request: RouteRequest,
        view: ClusterView,
        candidates: Sequence[int],
        prefill: bool = False,
    ) -> list[float]:
        """S_w for each candidate, in candidate order (`prefill`: the P/D prefill profile)."""
        p: LlmDParams = self.params
        loads = view.loads
        if prefill:
            w_prefix, w_queue, w_kv, w_load = p.prefill_prefix_weight, p.prefill_queue_weight, 0, 0
        else:
            w_prefix, w_queue = p.prefix_weight, p.queue_weight
            w_kv, w_load = p.kv_utilization_weight, p.load_aware_weight
        q_min = q_max = loads[candidates[0]].waiting
        for w in candidates:
            q = loads[w].waiting
            q_min, q_max = min(q_min, q), max(q_max, q)
        q_span = q_max - q_min
        threshold = p.load_aware_queue_threshold
        out: list[float] = []
        for w in candidates:
            load = loads[w]
            s = 0.0
            if w_prefix:
                s += w_prefix * self.prefix_score(request, view, w)
            if w_queue:
                s += w_queue * ((q_max - load.waiting) / q_span if q_span else 1.0)
            if w_kv:
                s += w_kv * min(1.0, max(0.0, 1.0 - load.kv_usage))
            if w_load:
                s += w_load * 0.5 * max(0.0, 1.0 - load.waiting / threshold)
            out.append(s)
        return out

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        return self._pick(request, view, candidates, self.scores(request, view, candidates))

    def choose_prefill(
        self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]
    ) -> int:
        scores = self.scores(request, view, candidates, prefill=True)
        return self._pick(request, view, candidates, scores)

    def _pick(
        self,
        request: RouteRequest,
        view: ClusterView,
        candidates: Sequence[int],
        scores: list[float],
    ) -> int:
        """The highest score, ties uniformly at random; remembered in approximate mode."""
        high = max(scores)
        tied = [i for i, s in enumerate(scores) if s == high]
        w = candidates[tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]]
        p: LlmDParams = self.params
        if p.approximate and len(request.hashes):
            index = self._seen.get(w)
            if index is None:
                index = self._seen[w] = BlockIndex()
            index.insert(request.hashes, view.now_s, p.max_prefix_blocks)
            index.trim(p.lru_capacity_blocks or view.loads[w].capacity_blocks)
        return w

"""NVIDIA Dynamo's KV router, default selector: `lib/kv-router/src/scheduling/selector/default.rs`
(docs/router/kv_cache_routing.md). Formula as in shared/reference/routing.md.

Per candidate w, with block size B and a request of ISL tokens (request_blocks = ISL / B rounded
up), and the request's consecutive leading blocks cached on w per tier (`view.match`):

    decay_w   = 1 / (1 + d · ((prefill_tokens_w − min prefill_tokens) / B) / request_blocks)
    credit_w  = c · decay_w · device_w + 0.75 · host_w + 0.25 · disk_w + m_shared · shared_w
    raw_w     = request_blocks + ceil(prefill_tokens_w / B)    (blocks queued for prefill on w)
    logit_w   = s · max(0, raw_w − credit_w) + decode_blocks_w + a · active_w

The lowest logit wins, ties uniformly at random with the run's generator. With temperature
T > 0 the replica is drawn with P(w) ∝ exp(−(logit_w − min)/((max − min) · T)) (uniform when
all logits are equal).

Defaults (Dynamo's): s = `overlap_score_weight` = 1, c = `device_credit` = 1, host 0.75, disk 0.25,
m_shared = `shared_weight` = 0 (Dynamo uses 0.5 when shared-cache scoring is on), d = `decay` = 0
and a = `active_weight` = 0 (off), T = `temperature` = 0.

Sources: the formula in ai-dynamo/dynamo `lib/kv-router/src/scheduling/selector/default.rs` at
commit 07a6c9ce3bb0 (`worker_logit`); the defaults in `lib/kv-router/src/scheduling/config.rs`
(`impl Default for KvRouterConfig`, the v1.4-era version the code index stores; the Dynamo repo is
too large to fetch whole here, so its commit is not pinned). Dynamo's names: s =
`prefill_load_scale` (`overlap_score_weight` is its deprecated alias), c = `overlap_score_credit`,
d = `overlap_score_credit_decay`, a = `decode_active_request_weight`, T = `router_temperature`,
m_shared = `shared_cache_multiplier`, host/disk = `host_cache_hit_weight`/`disk_cache_hit_weight`.
Not modelled: the router-side queue (`router_queue_threshold`, off by default in that version).

`approximate=True` is Dynamo without KV events: it ignores `view.match` and counts as device
overlap the request's leading blocks it sent to w in the last `ttl_s` = 120 s of simulated time
(its approximate indexer's TTL), learning only from its own decisions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.routers.base import ClusterView, Router, RouteRequest, check_param
from kvsim.routers.prefix_index import BlockIndex


@dataclass(frozen=True)
class DynamoKvParams:
    # Defaults: KvRouterConfig::default() in config.rs (see the module docstring).
    overlap_score_weight: float = 1.0  # prefill_load_scale: default_prefill_load_scale() = 1.0
    """s: weight of the prefill blocks left after the cache credit."""
    device_credit: float = 1.0  # overlap_score_credit: 1.0
    """c: credit per request block already in the replica's HBM."""
    host_credit: float = 0.75  # host_cache_hit_weight: default_host_cache_hit_weight() = 0.75
    """Credit per block in node memory (dram, cxl)."""
    disk_credit: float = 0.25  # disk_cache_hit_weight: default_disk_cache_hit_weight() = 0.25
    """Credit per block on node storage (nvme)."""
    shared_weight: float = 0.0  # shared_cache_multiplier: 0.0 (0.5 with a shared cache type)
    """m_shared: credit per block in the pool shared by every node (Dynamo: 0.5 when on)."""
    decay: float = 0.0  # overlap_score_credit_decay: default_overlap_score_credit_decay() = 0.0
    """d: shrinks the device credit of replicas with more queued prefill than the least."""
    active_weight: float = 0.0  # decode_active_request_weight: 0.0
    """a: added cost per waiting or running request."""
    temperature: float = 0.0  # router_temperature: 0.0
    """T: 0 picks the lowest logit; > 0 samples, softer as T grows."""
    approximate: bool = False  # use_kv_events: true
    """Ignore the view's cache and learn from own routing decisions (no KV events)."""
    ttl_s: float = 120.0  # router_ttl_secs: 120.0 (approximate cache policy: ttl)
    """In approximate mode, how long a routed block is believed resident."""

    def __post_init__(self) -> None:
        for field in ("overlap_score_weight", "device_credit", "host_credit", "disk_credit"):
            check_param(getattr(self, field) >= 0, field, "must be >= 0")
        check_param(self.shared_weight >= 0, "shared_weight", "must be >= 0")
        check_param(self.decay >= 0, "decay", "must be >= 0")
        check_param(self.active_weight >= 0, "active_weight", "must be >= 0")
        check_param(self.temperature >= 0, "temperature", "must be >= 0")
        check_param(self.ttl_s > 0, "ttl_s", "must be > 0")


class DynamoKv(Router):
    """Lowest cost of prefill left after cache credit plus decode load."""

    name = "dynamo-kv"
    Params = DynamoKvParams

    def __init__(self, params: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(params, rng)
        self._seen: dict[int, BlockIndex] = {}  # approximate mode: replica -> routed blocks

    def logits(
        self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]
    ) -> list[float]:
        """logit_w for each candidate, in candidate order."""
        p: DynamoKvParams = self.params
        loads = view.loads
        bs = request.block_size
        request_blocks = max(1, request.blocks)
        min_prefill = min(loads[w].prefill_tokens for w in candidates) if p.decay else 0
        approximate = p.approximate
        if approximate:
            self._expire(view.now_s)
        out: list[float] = []
        for w in candidates:
            load = loads[w]
            if approximate:
                index = self._seen.get(w)
                device = index.match(request.hashes) if index is not None else 0
                host = disk = shared = 0
            else:
                m = view.match(w, request)
                device, host, disk, shared = m.device, m.host, m.disk, m.shared
            decay = 1.0
            if p.decay and device:
                extra_blocks = (load.prefill_tokens - min_prefill) / bs
                decay = 1.0 / (1.0 + p.decay * extra_blocks / request_blocks)
            credit = (
                p.device_credit * decay * device
                + p.host_credit * host
                + p.disk_credit * disk
                + p.shared_weight * shared
            )
            raw = request_blocks + -(-load.prefill_tokens // bs)
            out.append(
                p.overlap_score_weight * max(0.0, raw - credit)
                + load.decode_blocks
                + p.active_weight * (load.waiting + load.running)
            )
        return out

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        logits = self.logits(request, view, candidates)
        t = self.params.temperature
        if t > 0:
            w = candidates[self._sample(logits, t)]
        else:
            low = min(logits)
            tied = [i for i, x in enumerate(logits) if x == low]
            w = candidates[tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]]
        if self.params.approximate:
            index = self._seen.get(w)
            if index is None:
                index = self._seen[w] = BlockIndex()
            index.insert(request.hashes, view.now_s)
        return w

    def _sample(self, logits: list[float], temperature: float) -> int:
        """Position drawn with P ∝ exp(−(logit − min)/((max − min)·T)); uniform if all equal."""
        low, high = min(logits), max(logits)
        if high == low:
            return self.rng.randrange(len(logits))
        scale = (high - low) * temperature
        weights = [math.exp(-(x - low) / scale) for x in logits]
        r = self.rng.random() * sum(weights)
        for i, wt in enumerate(weights):
            r -= wt
            if r < 0:
                return i
        return len(weights) - 1

    def _expire(self, now_s: float) -> None:
        before = now_s - self.params.ttl_s
        for index in self._seen.values():
            index.expire(before)

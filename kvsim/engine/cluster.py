"""Many replicas behind a router: placement on nodes, the router's view of them, and the choice
of where each request runs (under P/D, kvsim.engine.handoff moves it between replicas).

- Placement: replica i of `tp` GPUs sits on node `i * tp // gpus_per_node` (replicas fill nodes
  in order; under P/D the prefill replicas come first).
- The router sees a `ClusterView`: live state when `router_refresh_s` is 0, else snapshots of
  each replica's load and HBM contents taken every `router_refresh_s` simulated seconds (HBM
  changes are journalled by the pool and replayed at each refresh, as an indexer fed by KV
  events would; lower tiers are read live, since they change slowly next to HBM).
- P/D: the router picks the decode replica first (llm-d's order). When that replica lacks at
  least `pd_threshold` prompt tokens, a prefill replica computes the prompt and the decode
  replica pulls the KV it lacks: over NVLink within a node, else over the fabric, the same link
  the rdma tier's loads, write-backs and prefetches use (kvsim.engine.handoff). Below the
  threshold the decode replica prefills locally.
- Hit attribution (kvsim.metrics.attribution): where the trace's reuse went, per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import takewhile

import numpy as np
import simpy

from kvsim.costmodel import CostModel
from kvsim.engine.handoff import Handoff
from kvsim.engine.scheduler import Scheduler
from kvsim.hardware.tier_kinds import tier_kind
from kvsim.kvcache.request import Request
from kvsim.metrics.attribution import Attribution
from kvsim.routers import ClusterView, PrefixMatch, ReplicaLoad, Router, RouteRequest


def batch_prefill_s(
    cost: CostModel, load: ReplicaLoad, tokens: int, context: int, chunk: int, block_size: int
) -> float:
    """Seconds to prefill `tokens` after `context` on a replica as loaded: every chunk's iteration
    also carries the decode steps of its running requests (at their mean context), as aggregated
    serving runs them. Mooncake's estimate is for prefill-only instances, whose batch is empty;
    priced alone, a busy replica holding the prefix looks faster than an idle one without it."""
    if tokens <= 0:
        return 0.0
    running = load.running if load.role != "prefill" else 0
    decode = np.full(running, load.decode_blocks * block_size // max(running, 1), dtype=np.float64)
    return cost.prefill_time_s(tokens, context, chunk, decode)


class CacheView:
    """The cluster as routers see it: live, or snapshots refreshed every `refresh_s`."""

    def __init__(
        self,
        env: simpy.Environment,
        replicas: list[Scheduler],
        cost: CostModel,
        chunk_tokens: int,
        refresh_s: float,
    ) -> None:
        self.env = env
        self.replicas = replicas
        self.cost = cost
        self.chunk_tokens = chunk_tokens
        self.refresh_s = refresh_s
        self.stale = refresh_s > 0
        self._loads: list[ReplicaLoad] | None = None  # the last snapshot (stale views)
        self._live_loads: list[ReplicaLoad] | None = None  # this decision's, computed once
        self._matches: dict[int, PrefixMatch] = {}
        self._live: dict[int, PrefixMatch] = {}
        # per replica, the HBM blocks the router last heard of (stale views only)
        self._known: list[dict[int, None]] = []
        if self.stale:
            for replica in replicas:
                assert replica.kv.pool.journal is not None, "built with journal=True"
                self._known.append({})
            self.refresh()
        self._classes = [
            [tier_kind(t.name).load_class for t in (r.kv.hierarchy.tiers if r.kv.hierarchy else ())]
            for r in replicas
        ]

    # -- ClusterView -----------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.env.now

    @property
    def loads(self) -> Sequence[ReplicaLoad]:
        if not self.stale:
            return self.live_loads()
        assert self._loads is not None  # taken at construction, then at every refresh
        return self._loads

    def match(self, replica: int, request: RouteRequest) -> PrefixMatch:
        if not self.stale:
            return self.live_match(replica, request)
        found = self._matches.get(replica)
        if found is None:
            found = self._matches[replica] = self._match(replica, request, self._known[replica])
        return found

    def queue_s(self, replica: int) -> float:
        return self.batch_prefill_s(self.loads[replica], self.loads[replica].prefill_tokens, 0)

    def prefill_s(self, replica: int, tokens: int, context: int) -> float:
        return self.batch_prefill_s(self.loads[replica], tokens, context)

    def batch_prefill_s(self, load: ReplicaLoad, tokens: int, context: int) -> float:
        return batch_prefill_s(
            self.cost, load, tokens, context, self.chunk_tokens, self.replicas[0].block_size
        )

    def load_s(self, replica: int, match: PrefixMatch) -> float:
        hierarchy = self.replicas[replica].kv.hierarchy
        if hierarchy is None or match.blocks == match.device:
            return 0.0
        counts = (0, match.host, match.disk, match.shared)
        total = 0.0
        for cls, count in enumerate(counts):
            if not count:
                continue
            for tier, tier_cls in zip(hierarchy.tiers, self._classes[replica], strict=True):
                if tier_cls == cls:  # the fastest tier of the class stands for it
                    link = tier.link
                    share = (link.reads_in_flight + 1) / link.read_bytes_per_s
                    total += link.latency_s + count * hierarchy.block_bytes * share
                    break
        return total

    # -- the cluster's side ----------------------------------------------------------------------
    def begin(self, request: RouteRequest) -> None:
        """A new routing decision: live figures are recomputed, snapshots are not."""
        self._matches.clear()
        self._live.clear()
        self._live_loads = None

    def live_loads(self) -> list[ReplicaLoad]:
        """Every replica's load now (computed once per decision)."""
        if self._live_loads is None:
            self._live_loads = [self._load(r) for r in self.replicas]
        return self._live_loads

    def live_match(self, replica: int, request: RouteRequest) -> PrefixMatch:
        found = self._live.get(replica)
        if found is None:
            found = self._live[replica] = self._match(
                replica, request, self.replicas[replica].kv.pool.refs
            )
        return found

    def _match(self, replica: int, request: RouteRequest, in_hbm) -> PrefixMatch:
        hashes = request.hashes
        device = len(list(takewhile(in_hbm.__contains__, hashes)))
        hierarchy = self.replicas[replica].kv.hierarchy
        if hierarchy is None or device == len(hashes):
            return PrefixMatch(device=device)
        counts = [device, 0, 0, 0]
        classes = self._classes[replica]
        for t in hierarchy.chain(hashes, device, len(hashes)):  # type: ignore[arg-type]
            counts[classes[t]] += 1
        return PrefixMatch(*counts)

    def _load(self, replica: Scheduler) -> ReplicaLoad:
        pool = replica.kv.pool
        running = len(replica.running) + len(replica.loading)
        return ReplicaLoad(
            index=replica.index,
            node=replica.node,
            role=replica.role,
            waiting=len(replica.waiting) + replica.arriving,
            running=running,
            prefill_tokens=max(replica.outstanding_tokens - len(replica.running), 0),
            decode_blocks=pool.used,
            kv_usage=pool.used / pool.num_blocks,
            capacity_blocks=pool.num_blocks,
        )

    def refresh(self) -> None:
        """Take the snapshot routers see until the next refresh."""
        self._loads = [self._load(r) for r in self.replicas]
        for replica, known in zip(self.replicas, self._known, strict=True):
            journal = replica.kv.pool.journal
            assert journal is not None
            for cached, keys in journal:
                if cached:
                    known.update(dict.fromkeys(keys))
                else:
                    for key in keys:
                        known.pop(key, None)
            journal.clear()


class LiveView:
    """The same cluster, seen live: what a shadow router with exact state is shown."""

    def __init__(self, view: CacheView) -> None:
        self.view = view

    @property
    def now_s(self) -> float:
        return self.view.env.now

    @property
    def loads(self) -> Sequence[ReplicaLoad]:
        return self.view.live_loads()

    def match(self, replica: int, request: RouteRequest) -> PrefixMatch:
        return self.view.live_match(replica, request)

    def queue_s(self, replica: int) -> float:
        load = self.loads[replica]
        return self.view.batch_prefill_s(load, load.prefill_tokens, 0)

    def prefill_s(self, replica: int, tokens: int, context: int) -> float:
        return self.view.batch_prefill_s(self.loads[replica], tokens, context)

    def load_s(self, replica: int, match: PrefixMatch) -> float:
        return self.view.load_s(replica, match)


class Cluster:
    """Routes arriving requests and moves P/D requests from their prefill to decode replica."""

    def __init__(
        self,
        env: simpy.Environment,
        replicas: list[Scheduler],
        router: Router,
        view: CacheView,
        *,
        session_of: np.ndarray,
        block_size: int,
        pd_split: tuple[int, int] | None,
        pd_threshold: int | None,
        handoff: Handoff | None,
        attribution: Attribution,
        shadow: Router | None = None,
    ) -> None:
        self.env = env
        # beside a router that sees snapshots, the same router shown live state: what the
        # snapshots cost is the reuse its choices would have found and the real ones did not
        self.shadow = shadow
        self.live_view = LiveView(view)
        self.replicas = replicas
        self.router = router
        self.view = view
        self.session_of = session_of
        self.block_size = block_size
        self.handoff = handoff
        self.attribution = attribution
        self.everyone = list(range(len(replicas)))
        self.prefill_ids: list[int] = []
        self.decode_ids: list[int] = []
        if pd_split is not None:
            p, _ = pd_split
            self.prefill_ids = self.everyone[:p]
            self.decode_ids = self.everyone[p:]
        threshold = pd_threshold if pd_threshold is not None else router.pd_threshold_tokens
        self.pd_threshold = threshold or 0
        self.local_prefills = 0
        self.disaggregated = 0

    def _route_request(self, req: Request) -> RouteRequest:
        """`req` as routers see it; the view starts a new decision."""
        if req.table.hashes is None:
            self.replicas[0].kv.load_chain(req)
        hashes = req.table.hashes
        assert hashes is not None
        bs = self.block_size
        full = min(req.input_tokens // bs, len(hashes))
        route = RouteRequest(
            req.index,
            int(self.session_of[req.index]),
            req.input_tokens,
            bs,
            hashes[:full],
            req.hint,
        )
        self.view.begin(route)
        return route

    def _attribute(
        self, req: Request, route: RouteRequest, target: int, exact: int | None = None
    ) -> None:
        usable = min((req.input_tokens - 1) // self.block_size, len(route.hashes))
        self.attribution.record(req, route, self.view, target, usable, exact)

    def _exact_choice(self, req: Request, route: RouteRequest) -> int | None:
        """Where the shadow router, shown live state, would send `req` (stale runs only)."""
        shadow = self.shadow
        if shadow is None:
            return None
        live = self.live_view
        if not self.decode_ids:
            return shadow.choose(route, live, self.everyone)
        if req.handoff == "prefill":
            return shadow.choose_prefill(route, live, self.prefill_ids)
        return shadow.choose(route, live, self.decode_ids)

    def attribute_alone(self, req: Request) -> None:
        """A lone replica: nothing to route, but its reuse still splits into captured and lost."""
        self._attribute(req, self._route_request(req), 0)

    def warm_choice(self, req: Request, view: ClusterView) -> int:
        """Where the router sends `req` when shown `view` (the cache-only warm-up of a sharded
        window, kvsim.engine.warmup: aggregated serving only, nothing attributed)."""
        if len(self.replicas) == 1:
            return 0
        return self.router.choose(self._route_request(req), view, self.everyone)

    def route(self, req: Request) -> None:
        """Choose where `req` runs (under P/D: where it decodes and where it is prefilled)."""
        if len(self.replicas) == 1:
            self.attribute_alone(req)
            self.replicas[0].submit(req)
            return
        route = self._route_request(req)
        view = self.view
        bs = self.block_size
        if self.decode_ids:
            target = self.router.choose(route, view, self.decode_ids)
            uncached = req.input_tokens - view.match(target, route).device * bs
            if uncached >= self.pd_threshold:
                assert self.handoff is not None
                self.handoff.send(req, target)
                target = self.router.choose_prefill(route, view, self.prefill_ids)
                self.disaggregated += 1
            else:
                self.local_prefills += 1
        else:
            target = self.router.choose(route, view, self.everyone)
        self._attribute(req, route, target, self._exact_choice(req, route))
        self.replicas[target].submit(req)

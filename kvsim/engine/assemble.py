"""The composition root: a run's replicas and the cluster around them, built from a
`ResolvedEngine` through constructors, in one place.

A replica is built bottom-up: eviction policy → block pool (head-granular when the policy frees
KV-head groups) → memory hierarchy (its node's tiers, the cluster's shared ones) → KV-cache
manager (with the offline oracle's future when a policy needs one) → iteration pricer (plain,
linear-quant or per-request compressed) → scheduler. The cluster then takes the replicas, the
router (and, when routers see snapshots, a shadow router shown live state), the cache view and
the P/D links. Tests build replicas and clusters the same way (`RunParts`, `build_replica`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from kvsim.costmodel import CostModel, make_cost_model
from kvsim.engine.cluster import CacheView, Cluster
from kvsim.engine.compress import AutoChooser, EngineCompression
from kvsim.engine.handoff import Handoff
from kvsim.engine.pricing import make_pricer
from kvsim.engine.resolve import ResolvedEngine
from kvsim.engine.scheduler import Scheduler
from kvsim.engine.tiers import (
    build_hierarchy,
    build_shared_tiers,
    fabric_link,
    host_link,
    layer_pieces,
    node_of,
)
from kvsim.engine.trace_view import TraceRequests
from kvsim.kvcache import BlockPool
from kvsim.kvcache.compact_tier import CompactLRU
from kvsim.kvcache.group_pool import GroupPool
from kvsim.kvcache.hierarchy import LowerTier
from kvsim.kvcache.link import Link
from kvsim.kvcache.manager import KVCacheManager
from kvsim.kvcache.request import Request
from kvsim.metrics.attribution import Attribution
from kvsim.models import kv_bytes_per_token
from kvsim.policies import make_policy
from kvsim.policies.lru import LRU
from kvsim.policies.oracle import FutureUses
from kvsim.routers import make_router
from kvsim.traces.schema import SEGMENT_KINDS

FinishFn = Callable[[Request], None]


@dataclass
class RunParts:
    """What every replica of a run shares: the clock, the trace, the cost model, the
    compression engines, the cluster's shared tiers and fabric, the nodes' shared links."""

    env: simpy.Environment
    run: ResolvedEngine
    source: TraceRequests
    cost: CostModel
    engines: list[EngineCompression]  # one per compression candidate (one unless auto)
    run_comp: EngineCompression | None  # the profile every request carries (None: none/auto)
    fabric: Link | None
    shared: dict[str, LowerTier]
    pieces: tuple[int, int]  # DMA copies of one block, per layer / per K and V tensor
    tier_block_bytes: int  # a block in a lower tier holds every rank's share of it
    rerotate_s_per_token: float
    node_links: dict[tuple[str, int], Link] = field(default_factory=dict)
    future: FutureUses | None = None  # built on first need (`future_uses`)

    @classmethod
    def build(cls, env: simpy.Environment, run: ResolvedEngine, source: TraceRequests) -> RunParts:
        config, model, profile = run.config, run.model, run.profile
        cost = make_cost_model(
            model,
            profile,
            tp=config.tp,
            kv_dtype=config.kv_dtype,
            weight_dtype=config.weight_dtype,
            engine=run.engine,
        )
        comp = run.compression
        auto = comp.per_request_choice
        rates = cost.roofline.rates if hasattr(cost, "roofline") else cost.rates
        engines = [
            EngineCompression(
                c, i, model, config.kv_dtype, config.tp, config.block_size, run.block_bytes, rates
            )
            for i, c in enumerate(comp.candidates if auto else (comp,))
        ]
        if not auto:
            # one profile for every request: its salt would relabel every chain alike and
            # change no hit, so chains are salted only where compressions mix (auto)
            for e in engines:
                e.salt = 0
        tier_block_bytes = run.block_bytes * config.tp
        fabric = fabric_link(env, profile, config.tp, run.replica_count)
        pieces = layer_pieces(model)
        shared = build_shared_tiers(
            env, profile, config, run.tiers, tier_block_bytes, run.replica_count, fabric, pieces
        )
        token_bytes = kv_bytes_per_token(model, config.kv_dtype, config.tp)
        # re-rotating a reused token's keys reads and writes them once (an elementwise pass)
        hbm_rate = profile.gpu.hbm_bandwidth_bytes_per_s * profile.efficiency.memory
        return cls(
            env=env,
            run=run,
            source=source,
            cost=cost,
            engines=engines,
            run_comp=None if comp.identity or auto else engines[0],
            fabric=fabric,
            shared=shared,
            pieces=pieces,
            tier_block_bytes=tier_block_bytes,
            rerotate_s_per_token=token_bytes / hbm_rate,
        )

    def future_uses(self) -> FutureUses:
        """When each block is next used, for an offline oracle: built once, on first need."""
        if self.future is None:
            self.future = self.source.future_uses(self.run_comp.salt if self.run_comp else 0)
        return self.future


def build_replica(
    parts: RunParts,
    index: int,
    role: str,
    on_finish: FinishFn,
    handoff: Handoff | None = None,
) -> Scheduler:
    """Replica `index`: policy → pool → hierarchy → KV-cache manager → pricer → scheduler.
    `handoff` moves its requests to and from other replicas under P/D."""
    env, run, source = parts.env, parts.run, parts.source
    config, model, profile = run.config, run.model, run.profile
    policy = make_policy(run.tiers.policies["hbm"], run.tiers.params_of("hbm"))
    if type(policy) is LRU:
        # the same victims from a queue of int32 ids: 4 bytes a block instead of about 200 (a
        # fleet's HBM holds millions); a key that is no such id brings LRU back (BlockPool)
        policy = CompactLRU()
    # ema-head with head_granular=true frees KV-head groups; every other policy whole blocks
    pool_kind = GroupPool if policy.head_groups() > 1 else BlockPool
    # routers that see snapshots replay each pool's journal of HBM changes at every refresh
    pool = pool_kind(run.num_blocks, policy, run.block_bytes, config.router_refresh_s > 0)
    node = node_of(index, config.tp, profile.gpus_per_node)
    hierarchy = build_hierarchy(
        env,
        profile,
        config,
        run.tiers,
        parts.tier_block_bytes,
        # a head-granular HBM holds a block for the tiers below only while it is whole
        pool.holds_whole if isinstance(pool, GroupPool) else pool.refs.__contains__,
        parts.shared,
        parts.pieces,
        node=node,
        node_links=parts.node_links,
        source=index,
    )
    needs_future = policy.needs_future or any(t.policy.needs_future for t in hierarchy.tiers)
    describes = pool.describes

    def load_chain(req: Request) -> None:
        source.load_chain(req, describes, config.rope_reuse)

    kv = KVCacheManager(
        pool,
        hierarchy,
        parts.cost,
        block_size=config.block_size,
        chunk_tokens=config.max_num_batched_tokens,
        prefix_caching=config.enable_prefix_caching,
        rope_reuse=config.rope_reuse,
        load_chain=load_chain,
        rerotate_s_per_token=parts.rerotate_s_per_token,
        kind_names=SEGMENT_KINDS,
        future=parts.future_uses() if needs_future else None,
        load_overlap=config.load_overlap,
        layers=model.num_layers,
    )
    offloading = any(e.offload for e in parts.engines)
    pricer = make_pricer(
        env,
        parts.cost,
        compressed=not run.compression.identity,
        comp=parts.run_comp,
        compacting=any(e.drops for e in parts.engines),
        # InfiniGen's fetches ride the host link tier traffic to DRAM uses
        host_link=host_link(env, profile, config, hierarchy) if offloading else None,
    )
    return Scheduler(env, config, kv, pricer, on_finish, index, role, node, handoff)


@dataclass
class Fleet:
    """A run's serving system: its replicas, the cluster routing to them, and what the
    workload and the results need from it."""

    parts: RunParts
    replicas: list[Scheduler]
    cluster: Cluster
    view: CacheView
    nvlinks: dict[int, Link]
    chooser: AutoChooser | None  # auto compression's per-request choice

    @property
    def run_comp(self) -> EngineCompression | None:
        return self.parts.run_comp


def assemble(parts: RunParts, on_finish: FinishFn) -> Fleet:
    """Every replica of the run, the cluster around them and, under auto, the chooser."""
    run, env = parts.run, parts.env
    config, profile = run.config, run.profile
    seed = config.seed
    router = make_router(config.router, run.router_params, random.Random(seed))
    shadow = None
    if config.router_refresh_s > 0 and run.replica_count > 1:
        shadow = make_router(config.router, run.router_params, random.Random(seed))
    nvlink_bytes_per_s = profile.gpu.interconnect_bandwidth_bytes_per_s * config.tp
    hbm_latency_s = profile.tier("hbm").latency_s
    nvlinks = {
        i: Link(env, f"nvlink{i}", nvlink_bytes_per_s, nvlink_bytes_per_s, hbm_latency_s)
        for i, role in enumerate(run.roles)
        if role == "prefill"
    }
    replicas: list[Scheduler] = []  # filled below; the hand-off reads it only once requests flow
    handoff = None
    if run.pd_split is not None:
        token_bytes = kv_bytes_per_token(run.model, config.kv_dtype, config.tp)
        handoff = Handoff(
            env,
            replicas,
            block_size=config.block_size,
            kv_bytes_per_token=token_bytes * config.tp,
            fabric=parts.fabric,
            nvlinks=nvlinks,
        )
    for i, role in enumerate(run.roles):
        replicas.append(build_replica(parts, i, role, on_finish, handoff))
    view = CacheView(
        env, replicas, parts.cost, config.max_num_batched_tokens, config.router_refresh_s
    )
    cluster = Cluster(
        env,
        replicas,
        router,
        view,
        session_of=parts.source.session_id,
        block_size=config.block_size,
        pd_split=run.pd_split,
        pd_threshold=config.pd_threshold,
        handoff=handoff,
        attribution=Attribution(parts.source.reused_blocks()),
        shadow=shadow,
    )
    chooser = None
    if run.compression.per_request_choice:
        memory = config.auto_memory_fraction * run.num_blocks * run.block_bytes
        chooser = AutoChooser(
            parts.engines, parts.cost, config.auto_latency_budget_s, memory, replicas
        )
    return Fleet(parts, replicas, cluster, view, nvlinks, chooser)

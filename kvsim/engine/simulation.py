"""Wire a trace, a model, a hardware profile and a policy into one SimPy run of a replica."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import simpy

from kvsim.capacity import profile_capacity_report
from kvsim.engine.cluster import Attribution, CacheView, Cluster, node_of
from kvsim.engine.compress import AutoChooser, EngineCompression, page_bytes, parse
from kvsim.engine.config import EngineConfig
from kvsim.engine.replica import Replica
from kvsim.engine.request import Request
from kvsim.engine.settings import resolve_settings
from kvsim.engine.tiers import (
    build_hierarchy,
    build_shared_tiers,
    fabric_link,
    host_link,
    hourly_cost_usd,
    layer_pieces,
    resolve_profile,
)
from kvsim.errors import ConfigError, KvsimError
from kvsim.hardware.measured import make_cost_model
from kvsim.hardware.profile import HardwareProfile
from kvsim.kvcache import BlockPool
from kvsim.kvcache.group_pool import GroupPool
from kvsim.kvcache.link import Link
from kvsim.kvcache.manager import KVCacheManager
from kvsim.metrics.requests import RequestLog
from kvsim.metrics.timeline import Timeline, link_report, pd_link_report, tier_report
from kvsim.models import ModelSpec, kv_bytes_per_block, kv_bytes_per_token
from kvsim.policies import make_policy
from kvsim.policies.oracle import FutureUses
from kvsim.routers import make_router, parse_router_params
from kvsim.traces import Trace
from kvsim.traces.blocks import (
    batch_sequence_block_hashes,
    block_kinds,
    first_seen_ids,
)
from kvsim.traces.schema import KIND_CODES, SEGMENT_KINDS, segment_columns
from kvsim.traces.stats import reused_from_ids

ProgressFn = Callable[[int, int], None]
# segments whose KV can be reused at another position (a document, a tool's output)
_POSITION_INDEPENDENT = np.array([KIND_CODES["document"], KIND_CODES["tool"]], dtype=np.uint8)


@dataclass
class RunResult:
    """Everything a run measured; `kvsim.metrics` turns it into a summary and files."""

    requests: pa.Table
    simulated_s: float
    wall_s: float
    num_gpu_blocks: int
    block_bytes: int
    block_size: int
    iterations: int
    coalesced_steps: int
    busy_s: float
    block_ops: int
    evictions: int
    cost_model: str = "roofline"
    cost_model_reason: str = ""
    tiers: dict[str, dict[str, float]] = field(default_factory=dict)
    links: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: pa.Table | None = None
    hourly_cost_usd: dict[str, float] = field(default_factory=dict)
    prefetched_blocks: int = 0
    replicas: list[dict[str, object]] = field(default_factory=list)
    router: str = ""  # set for a cluster run
    attribution: Attribution | None = None
    pd: dict[str, int] = field(default_factory=dict)  # set for a P/D run
    warnings: list[str] = field(default_factory=list)  # settings that did nothing
    # KV compression (kvsim.engine.compress): the run's canonical label, each request's
    # label (one value unless auto) and the most KV bytes it held at once (on one rank),
    # and the most KV bytes running requests held at once on one replica (one rank)
    compression: str = "none"
    request_compression: pa.Array | None = None
    kv_peak_bytes: np.ndarray | None = None
    peak_hbm_kv_bytes: int = 0

    def requests_with_compression(self) -> pa.Table:
        """`requests` with the columns every requests.parquet has: ``compression`` (the label
        each request ran with) and ``kv_peak_bytes`` (kept apart so that the table of a run
        without compression stays the one earlier versions wrote, byte for byte)."""
        t = self.requests
        if "compression" not in t.column_names:
            labels = self.request_compression
            if labels is None:
                labels = pa.array([self.compression] * t.num_rows, pa.string())
            t = t.append_column("compression", labels)
        if "kv_peak_bytes" not in t.column_names and self.kv_peak_bytes is not None:
            t = t.append_column("kv_peak_bytes", pa.array(self.kv_peak_bytes))
        return t


def kv_blocks_for(
    model: ModelSpec,
    profile: HardwareProfile,
    config: EngineConfig,
    block_bytes: int | None = None,
) -> tuple[int, int]:
    """(KV blocks per replica, bytes of one block on one rank) from HBM left after weights;
    `block_bytes` when a compression makes pages smaller (kvsim.engine.compress.page_bytes)."""
    if block_bytes is None:
        block_bytes = kv_bytes_per_block(model, config.block_size, config.kv_dtype, config.tp)
    if config.num_gpu_blocks is not None:
        return config.num_gpu_blocks, block_bytes
    report = profile_capacity_report(
        model,
        profile,
        tp=config.tp,
        kv_dtype=config.kv_dtype,
        weight_dtype=config.weight_dtype,
        block_size=config.block_size,
    )
    blocks = int(report["kv_capacity_bytes_per_rank"] // block_bytes)
    if blocks < 1:
        raise KvsimError(
            f"{model.name} at tp={config.tp} leaves no HBM for KV blocks on {profile.name}"
        )
    return blocks, block_bytes


class _TraceRequests:
    """Columnar view of a canonical trace, turned into engine Requests on demand."""

    def __init__(self, trace: Trace, block_size: int) -> None:
        t = trace.table
        self.n = t.num_rows
        self.block_size = block_size
        self.request_id = t.column("request_id").to_numpy()
        self.session_id = t.column("session_id").to_numpy()
        self.turn = t.column("turn").to_numpy()
        self.arrival_s = t.column("arrival_s").to_numpy()
        think = t.column("think_time_s")
        self.closed_loop = think.is_valid().to_numpy(zero_copy_only=False) & (self.turn > 0)
        self.think_time_s = think.fill_null(0.0).to_numpy()
        self.input_tokens = t.column("input_tokens").to_numpy().astype(np.int64)
        self.output_tokens = t.column("output_tokens").to_numpy().astype(np.int64)
        self.output_hash = t.column("output_hash").to_numpy()
        segments = segment_columns(t)
        self.seg_offsets = segments.offsets
        self.seg_hash = segments.hashes
        self.seg_tokens = segments.tokens
        self.seg_kinds = segments.kinds
        self._ids: tuple[np.ndarray, np.ndarray] | None = None
        self._id_span = 0  # ids are 1 .. span - 1: a salt's range starts at a multiple of it
        self._salt_slots: dict[int, int] = {0: 0}

    def _block_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(block offsets, block ids) of every request's chain (`sequence_block_hashes`:
        prompt, then a content-addressed reply), numbered by first appearance in trace order
        (kvsim.traces.blocks.first_seen_ids). Built once, on first use, in numpy passes over
        the whole trace."""
        if self._ids is None:
            block_offsets, blocks = batch_sequence_block_hashes(
                self.seg_offsets,
                self.seg_hash,
                self.seg_tokens,
                self.output_hash,
                self.output_tokens,
                self.block_size,
            )
            ids = first_seen_ids(blocks)
            self._id_span = int(ids.max(initial=0)) + 1
            narrow = np.int32 if self._id_span < np.iinfo(np.int32).max else np.int64
            self._ids = (block_offsets, ids.astype(narrow))
        return self._ids

    def reused_blocks(self) -> np.ndarray:
        """kvsim.traces.stats.reused_blocks at the engine's cap (at least one prompt token is
        computed), from the chains' ids."""
        offsets, ids = self._block_ids()
        return reused_from_ids(offsets, ids, (self.input_tokens - 1) // self.block_size)

    def _salted(self, ids: np.ndarray, salt: int) -> np.ndarray:
        """Block ids under a compression's salt (kvsim.compression; 0 for none): each salt gets
        its own range of ids, so blocks of different compressions never match."""
        if not salt:
            return ids
        slot = self._salt_slots.setdefault(salt, len(self._salt_slots))
        self._block_ids()
        return ids.astype(np.int64) + slot * self._id_span

    def load_chain(self, req: Request, with_kinds: bool, with_segments: bool = False) -> None:
        """Fill `req.table.hashes` (full blocks of prompt + reply) and, if asked, each block's
        kind and the request's reusable segments."""
        i = req.index
        table = req.table
        lo, hi = self.seg_offsets[i], self.seg_offsets[i + 1]
        block_offsets, ids = self._block_ids()
        chain = ids[block_offsets[i] : block_offsets[i + 1]]
        comp = req.comp
        if comp is not None and comp.salt:  # blocks of another compression never match
            chain = self._salted(chain, comp.salt)
        table.hashes = chain.tolist()
        if with_segments:
            kinds, tokens = self.seg_kinds[lo:hi], self.seg_tokens[lo:hi]
            ends = np.cumsum(tokens)
            starts = ends - tokens
            hashes = self.seg_hash[lo:hi]
            table.pic_segments = [
                (int(starts[j]), int(ends[j]), int(hashes[j]))
                for j in np.flatnonzero(np.isin(kinds, _POSITION_INDEPENDENT))
            ] or None
        if with_kinds:
            kinds, tokens = self.seg_kinds[lo:hi], self.seg_tokens[lo:hi]
            if self.output_hash[i]:
                kinds = np.append(kinds, np.uint8(KIND_CODES["assistant"]))
                tokens = np.append(tokens, int(self.output_tokens[i]))
            table.kinds = block_kinds(kinds, tokens, self.block_size)

    def future_uses(self, salt: int = 0) -> FutureUses:
        """For an offline oracle (Belady): when is a block next part of an arriving prompt?

        Uses each request's nominal `arrival_s`; closed-loop turns arrive when the simulation
        says, so for them this is the trace's estimate, the best an oracle given the trace can
        know. `salt`: the run's compression (under auto, chosen per request, the oracle sees
        none). A request's full prompt blocks lead its chain (a block's hash covers only the
        tokens up to its end), so their keys are the chain's first ones."""
        offsets, ids = self._block_ids()
        tokens = np.concatenate(([0], np.cumsum(self.seg_tokens, dtype=np.int64)))
        counts = (tokens[self.seg_offsets[1:]] - tokens[self.seg_offsets[:-1]]) // self.block_size
        row = np.repeat(np.arange(self.n), np.diff(offsets))
        first = (np.arange(ids.size) - offsets[row]) < counts[row]
        return FutureUses(self._salted(ids[first], salt), np.repeat(self.arrival_s, counts))

    def next_turns(self) -> dict[int, int]:
        """Index of each closed-loop request keyed by the index of the turn it follows."""
        by_key = {
            (int(s), int(k)): i
            for i, (s, k) in enumerate(zip(self.session_id, self.turn, strict=True))
        }
        follows: dict[int, int] = {}
        for i in np.flatnonzero(self.closed_loop):
            prev = by_key.get((int(self.session_id[i]), int(self.turn[i]) - 1))
            if prev is None:
                self.closed_loop[i] = False  # its earlier turn is not in this trace: replay it
            else:
                follows[prev] = int(i)
        return follows


def simulate(
    trace: Trace,
    model: ModelSpec,
    profile: HardwareProfile,
    config: EngineConfig,
    progress: ProgressFn | None = None,
) -> RunResult:
    """Replay `trace` through `config.replica_count` replicas and return per-request results."""
    wall_start = time.perf_counter()
    settings = resolve_settings(config)
    profile = resolve_profile(profile, settings)
    unused_settings = settings.unused([t.name for t in profile.tiers if t.enabled])
    comp = parse(config.compression)
    if comp.name != "none" and config.pd_split is not None:
        raise ConfigError(
            "engine.compression: prefill/decode disaggregation moves uncompressed prompts; "
            "compression with --pd is not modelled"
        )
    auto = comp.name == "auto"
    candidates = comp.candidates if auto else (comp,)
    bs, dtype, tp = config.block_size, config.kv_dtype, config.tp
    # under auto a page must hold the least compressed candidate's tokens
    pages = max(page_bytes(model, c, bs, dtype, tp) for c in candidates)
    num_blocks, block_bytes = kv_blocks_for(
        model, profile, config, None if comp.name == "none" else pages
    )
    cost = make_cost_model(
        model, profile, tp=config.tp, kv_dtype=config.kv_dtype, weight_dtype=config.weight_dtype
    )
    rates = cost.roofline.rates if hasattr(cost, "roofline") else cost.rates
    engines = [
        EngineCompression(c, i, model, dtype, tp, bs, block_bytes, rates)
        for i, c in enumerate(candidates)
    ]
    run_comp = None if comp.name == "none" or auto else engines[0]
    if not auto:
        # one profile for every request: its salt would relabel every chain alike and change
        # no hit, so chains are salted only where compressions mix (auto)
        for e in engines:
            e.salt = 0
    compacting = any(e.drops for e in engines)
    offloading = any(e.offload for e in engines)
    count = config.replica_count
    split = config.pd_split
    roles = ["mixed"] * count if split is None else ["prefill"] * split[0] + ["decode"] * split[1]
    router_params = parse_router_params(config.router_params).get(config.router)
    router = make_router(config.router, router_params, random.Random(config.seed))
    shadow = None
    if config.router_refresh_s > 0 and config.replica_count > 1:
        shadow = make_router(config.router, router_params, random.Random(config.seed))
    source = _TraceRequests(trace, config.block_size)
    env = simpy.Environment()
    # a block in a lower tier holds every rank's share of it
    tier_block_bytes = block_bytes * config.tp
    fabric = fabric_link(env, profile, config.tp, count)
    pieces = layer_pieces(model)
    shared = build_shared_tiers(
        env, profile, config, settings, tier_block_bytes, count, fabric, pieces
    )
    node_links: dict = {}  # a node's tiers its reading replicas share (NVMe drives)
    future: FutureUses | None = None
    token_bytes = kv_bytes_per_token(model, config.kv_dtype, config.tp)
    # re-rotating a reused token's keys reads and writes them once (an elementwise pass)
    rerotate_s = token_bytes / (profile.gpu.hbm_bandwidth_bytes_per_s * profile.efficiency.memory)
    follows = source.next_turns()
    capacity_tokens = num_blocks * config.block_size
    completed = 0
    log = RequestLog(source.n, sum(1 for t in profile.tiers if t.name != "hbm" and t.enabled))
    live: dict[int, Request] = {}  # issued or about to be, not yet recorded

    comp_codes = np.zeros(source.n, dtype=np.int16)  # each request's index into `engines`
    kv_peak_blocks = np.zeros(source.n, dtype=np.int64)

    def request(i: int) -> Request:
        req = live[i] = Request(i, int(source.input_tokens[i]), int(source.output_tokens[i]))
        req.comp = run_comp
        return req

    replicas: list[Replica] = []

    def on_finish(req: Request) -> None:
        nonlocal completed
        completed += 1
        log.record(req)
        kv_peak_blocks[req.index] = req.kv_peak_blocks
        if req.comp is not None:
            comp_codes[req.index] = req.comp.code
        del live[req.index]
        if progress is not None:
            progress(completed, source.n)
        nxt = follows.get(req.index)
        if nxt is not None:
            think = float(source.think_time_s[nxt])
            turn = request(nxt)
            env.timeout(think).callbacks.append(lambda _ev, r=turn: issue(r))
            replica = replicas[req.replica]
            if replica.hierarchy and config.prefetch:
                # the session will continue: bring its blocks up before the next turn is due
                # (towards the replica that served it, where a session-aware router sends it)
                lead = max(think - config.prefetch_lead_s, 0.0)
                env.timeout(lead).callbacks.append(lambda _ev, r=turn: replica.prefetch(r))

    for index, role in enumerate(roles):
        policy = make_policy(settings.policies["hbm"], settings.params_of("hbm"))
        # ema-head with head_granular=true frees KV-head groups; every other policy whole blocks
        pool_kind = GroupPool if policy.head_groups() > 1 else BlockPool
        pool = pool_kind(num_blocks, policy, block_bytes)
        node = node_of(index, config.tp, profile.gpus_per_node)
        hierarchy = build_hierarchy(
            env,
            profile,
            config,
            settings,
            tier_block_bytes,
            # a head-granular HBM holds a block for the tiers below only while it is whole
            pool.holds_whole if isinstance(pool, GroupPool) else pool.refs.__contains__,
            shared,
            pieces,
            node=node,
            node_links=node_links,
            source=index,
        )
        if future is None and (
            policy.needs_future or any(t.policy.needs_future for t in hierarchy.tiers)
        ):
            future = source.future_uses(run_comp.salt if run_comp else 0)
        describes = pool.describes

        def load_chain(req: Request, describes: bool = describes) -> None:
            source.load_chain(req, describes, config.rope_reuse)

        kv = KVCacheManager(
            pool,
            hierarchy,
            cost,
            block_size=config.block_size,
            chunk_tokens=config.max_num_batched_tokens,
            prefix_caching=config.enable_prefix_caching,
            rope_reuse=config.rope_reuse,
            load_chain=load_chain,
            rerotate_s_per_token=rerotate_s,
            kind_names=SEGMENT_KINDS,
            future=future,
            load_overlap=config.load_overlap,
            layers=model.num_layers,
        )
        replica = Replica(env, config, kv, cost, on_finish, index, role, node)
        replica.compressed = comp.name != "none"
        replica.compacting = compacting
        if run_comp is not None and run_comp.linear_reads and not run_comp.offload:
            replica.linear = run_comp
        if offloading:  # InfiniGen's fetches ride the host link tier traffic to DRAM uses
            replica.host_link = host_link(env, profile, config, hierarchy)
        replicas.append(replica)

    view = CacheView(env, replicas, cost, config.max_num_batched_tokens, config.router_refresh_s)
    nvlink_bytes_per_s = profile.gpu.interconnect_bandwidth_bytes_per_s * config.tp
    hbm_latency_s = profile.tier("hbm").latency_s
    nvlinks = {
        i: Link(env, f"nvlink{i}", nvlink_bytes_per_s, nvlink_bytes_per_s, hbm_latency_s)
        for i, role in enumerate(roles)
        if role == "prefill"
    }
    cluster = Cluster(
        env,
        replicas,
        router,
        view,
        session_of=source.session_id,
        block_size=config.block_size,
        pd_split=split,
        pd_threshold=config.pd_threshold,
        kv_bytes_per_token=token_bytes * config.tp,
        fabric=fabric,
        nvlinks=nvlinks,
        attribution=Attribution(source.reused_blocks()),
        shadow=shadow,
    )
    one = replicas[0] if count == 1 else None

    chooser = None
    if auto:
        memory = config.auto_memory_fraction * num_blocks * block_bytes
        chooser = AutoChooser(engines, cost, config.auto_latency_budget_s, memory, replicas)

    def too_large(req: Request) -> bool:
        """A request that can never be served: beyond the model's context (vLLM refuses a prompt
        beyond max_model_len) or more blocks than a replica has at its peak."""
        total = req.input_tokens + req.output_tokens
        if model.max_context_tokens is not None and total > model.max_context_tokens:
            return True
        c = req.comp
        if c is None or not c.drops:
            reserved = c.reserved_blocks(total) if c is not None else 0
            return total > capacity_tokens - reserved * config.block_size
        prompt = -(-req.input_tokens // config.block_size)
        return max(prompt, c.kept_blocks(total, req.output_tokens)) > num_blocks

    def issue(req: Request) -> None:
        timeline.wake()
        if chooser is not None:
            req.comp = chooser.choose(req)
        if too_large(req):
            # like a prompt beyond max_model_len: it can never fit, so it is refused at once
            log.rejected[req.index] = True
            req.arrival_s = env.now
            req.finish_s = env.now
            on_finish(req)
            return
        if one is not None:
            cluster.attribute_alone(req)
            one.submit(req)
        else:
            cluster.route(req)

    timeline = Timeline(env, replicas, config.timeline_interval_s)

    def arrivals():
        order = np.flatnonzero(~source.closed_loop)
        order = order[np.argsort(source.arrival_s[order], kind="stable")]
        for i in order:
            delay = float(source.arrival_s[i]) - env.now
            if delay > 0:
                yield env.timeout(delay)
            issue(request(i))

    def refreshes():
        while completed < source.n:
            yield env.timeout(config.router_refresh_s)
            view.refresh()

    env.process(arrivals())
    env.process(timeline.sample(lambda: completed >= source.n))
    if view.stale:
        env.process(refreshes())
    env.run()
    wall_s = time.perf_counter() - wall_start
    is_cluster = count > 1
    for req in live.values():  # still in the system: unfinished
        log.record(req)
        kv_peak_blocks[req.index] = req.kv_peak_blocks
        if req.comp is not None:
            comp_codes[req.index] = req.comp.code
    table = log.table(
        source,
        replicas[0].kv.hierarchy,
        cluster=is_cluster,
        pd=bool(split),
        heads=replicas[0].pool.head_granular,
    )
    first = float(np.min(source.arrival_s)) if source.n else 0.0
    end = log.end_s(first)
    hierarchies = [r.kv.hierarchy for r in replicas if r.kv.hierarchy is not None]
    links = link_report(hierarchies)
    if split is not None:
        links.update(pd_link_report(fabric, list(nvlinks.values()), links))
    return RunResult(
        requests=table,
        simulated_s=max(end - first, 0.0),
        wall_s=wall_s,
        num_gpu_blocks=num_blocks,
        block_bytes=block_bytes,
        block_size=config.block_size,
        iterations=sum(r.iterations for r in replicas),
        coalesced_steps=sum(r.coalesced_steps for r in replicas),
        busy_s=sum(r.busy_s for r in replicas) / count,
        block_ops=sum(r.kv.block_ops for r in replicas),
        evictions=sum(r.pool.stats.evictions for r in replicas),
        cost_model=cost.kind,
        cost_model_reason=cost.reason,
        tiers=tier_report(hierarchies, tier_block_bytes),
        links=links,
        timeline=timeline.table(),
        hourly_cost_usd=hourly_cost_usd(profile, config, count),
        prefetched_blocks=sum(r.kv.prefetched_blocks for r in replicas),
        replicas=[replica_stats(r) for r in replicas],
        router=config.router if is_cluster else "",
        attribution=cluster.attribution,
        pd={"local_prefills": cluster.local_prefills, "disaggregated": cluster.disaggregated}
        if split
        else {},
        warnings=unused_settings,
        compression=comp.label,
        request_compression=pa.DictionaryArray.from_arrays(
            pa.array(comp_codes), pa.array([e.label for e in engines], pa.string())
        ).cast(pa.string())
        if auto
        else None,
        kv_peak_bytes=kv_peak_blocks * block_bytes,
        peak_hbm_kv_bytes=max(r.kv.peak_used_blocks for r in replicas) * block_bytes,
    )


def replica_stats(replica: Replica) -> dict[str, object]:
    """What one replica did, for the per-replica part of the summary."""
    return {
        "replica": replica.index,
        "role": replica.role,
        "node": replica.node,
        "iterations": replica.iterations,
        "busy_s": replica.busy_s,
        "evicted_blocks": replica.pool.stats.evictions,
        "prefetched_blocks": replica.kv.prefetched_blocks,
    }

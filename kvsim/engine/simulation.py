"""Wire a trace, a model, a hardware profile and a policy into one SimPy run of a replica."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import simpy

from kvsim.capacity import profile_capacity_report
from kvsim.engine.config import EngineConfig
from kvsim.engine.replica import Replica
from kvsim.engine.request import Request
from kvsim.engine.tiers import build_hierarchy, hourly_cost_usd, per_tier, resolve_profile
from kvsim.engine.timeline import Timeline, link_report, tier_report
from kvsim.errors import KvsimError
from kvsim.hardware.measured import make_cost_model
from kvsim.hardware.profile import HardwareProfile
from kvsim.kvcache import BlockPool
from kvsim.kvcache.hierarchy import Hierarchy
from kvsim.kvcache.manager import KVCacheManager
from kvsim.models import ModelSpec, kv_bytes_per_block, kv_bytes_per_token
from kvsim.policies import make_policy, parse_policy_params
from kvsim.traces import Trace
from kvsim.traces.blocks import batch_block_hashes, block_kinds, sequence_block_hashes
from kvsim.traces.schema import KIND_CODES, SEGMENT_KINDS, segment_columns

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


def kv_blocks_for(
    model: ModelSpec, profile: HardwareProfile, config: EngineConfig
) -> tuple[int, int]:
    """(KV blocks per replica, bytes of one block on one rank) from HBM left after weights."""
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

    def load_chain(self, req: Request, with_kinds: bool, with_segments: bool = False) -> None:
        """Fill `req.table.hashes` (full blocks of prompt + reply) and, if asked, each block's
        kind and the request's reusable segments."""
        i = req.index
        table = req.table
        lo, hi = self.seg_offsets[i], self.seg_offsets[i + 1]
        out_hash, out_tokens = int(self.output_hash[i]), int(self.output_tokens[i])
        table.hashes = sequence_block_hashes(
            self.seg_hash[lo:hi], self.seg_tokens[lo:hi], out_hash, out_tokens, self.block_size
        ).tolist()
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
            if out_hash:
                kinds = np.append(kinds, np.uint8(KIND_CODES["assistant"]))
                tokens = np.append(tokens, out_tokens)
            table.kinds = block_kinds(kinds, tokens, self.block_size)

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


class FutureUses:
    """For an offline oracle (Belady): when is a block next part of an arriving prompt?

    Uses each request's nominal `arrival_s`; closed-loop turns arrive when the simulation says,
    so for them this is the trace's estimate, the best an oracle given the trace can know."""

    def __init__(self, source: _TraceRequests, block_size: int) -> None:
        offsets, hashes = batch_block_hashes(
            source.seg_offsets, source.seg_hash, source.seg_tokens, block_size
        )
        times = np.repeat(source.arrival_s, np.diff(offsets))
        order = np.lexsort((times, hashes))
        self.hashes = hashes[order]
        self.times = times[order]
        keys, starts = np.unique(self.hashes, return_index=True)
        ends = np.append(starts[1:], len(self.hashes))
        self.span = dict(
            zip(keys.tolist(), zip(starts.tolist(), ends.tolist(), strict=True), strict=True)
        )

    def __call__(self, key: int, now_s: float) -> float:
        span = self.span.get(key)
        if span is None:
            return math.inf
        lo, hi = span
        i = lo + int(np.searchsorted(self.times[lo:hi], now_s, side="right"))
        return float(self.times[i]) if i < hi else math.inf


def simulate(
    trace: Trace,
    model: ModelSpec,
    profile: HardwareProfile,
    config: EngineConfig,
    progress: ProgressFn | None = None,
) -> RunResult:
    """Replay `trace` through one replica and return per-request results."""
    wall_start = time.perf_counter()
    profile = resolve_profile(profile, config)
    num_blocks, block_bytes = kv_blocks_for(model, profile, config)
    cost = make_cost_model(
        model, profile, tp=config.tp, kv_dtype=config.kv_dtype, weight_dtype=config.weight_dtype
    )
    hbm_policy = per_tier(config.policy, "policy", "lru")["hbm"]
    policy = make_policy(hbm_policy, parse_policy_params(config.policy_params).get(hbm_policy))
    pool = BlockPool(num_blocks, policy, block_bytes)
    source = _TraceRequests(trace, config.block_size)
    env = simpy.Environment()
    # a block in a lower tier holds every rank's share of it
    hierarchy = build_hierarchy(
        env, profile, config, block_bytes * config.tp, pool.refs.__contains__
    )
    future = None
    if policy.needs_future or any(t.policy.needs_future for t in hierarchy.tiers):
        future = FutureUses(source, config.block_size)
    describes = pool.describes

    def load_chain(req: Request) -> None:
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
        # re-rotating a reused token's keys reads and writes them once (an elementwise pass)
        rerotate_s_per_token=kv_bytes_per_token(model, config.kv_dtype, config.tp)
        / (profile.gpu.hbm_bandwidth_bytes_per_s * profile.efficiency.memory),
        kind_names=SEGMENT_KINDS,
        future=future,
    )
    follows = source.next_turns()
    requests = [
        Request(i, int(source.input_tokens[i]), int(source.output_tokens[i]))
        for i in range(source.n)
    ]
    capacity_tokens = num_blocks * config.block_size
    completed = 0
    rejected = np.zeros(source.n, dtype=bool)

    def issue(req: Request) -> None:
        if req.input_tokens + req.output_tokens > capacity_tokens:
            # like a prompt beyond max_model_len: it can never fit, so it is refused at once
            rejected[req.index] = True
            req.arrival_s = env.now
            req.finish_s = env.now
            on_finish(req)
            return
        replica.submit(req)

    def on_finish(req: Request) -> None:
        nonlocal completed
        completed += 1
        if progress is not None:
            progress(completed, source.n)
        nxt = follows.get(req.index)
        if nxt is not None:
            think = float(source.think_time_s[nxt])
            env.timeout(think).callbacks.append(lambda _ev, r=requests[nxt]: issue(r))
            if hierarchy and config.prefetch:
                # the session will continue: bring its blocks up before the next turn is due
                lead = max(think - config.prefetch_lead_s, 0.0)
                env.timeout(lead).callbacks.append(lambda _ev, r=requests[nxt]: replica.prefetch(r))

    replica = Replica(env, config, kv, cost, on_finish)
    timeline = Timeline(env, replica, hierarchy, config.timeline_interval_s)

    def arrivals():
        order = np.flatnonzero(~source.closed_loop)
        order = order[np.argsort(source.arrival_s[order], kind="stable")]
        for i in order:
            delay = float(source.arrival_s[i]) - env.now
            if delay > 0:
                yield env.timeout(delay)
            issue(requests[i])

    env.process(arrivals())
    env.process(timeline.sample(lambda: completed >= source.n))
    env.run()
    wall_s = time.perf_counter() - wall_start
    table = _requests_table(source, requests, rejected, hierarchy)
    first = float(np.min(source.arrival_s)) if source.n else 0.0
    finished = [r.finish_s for r in requests if r.finish_s >= 0]
    end = max(finished) if finished else first
    return RunResult(
        requests=table,
        simulated_s=max(end - first, 0.0),
        wall_s=wall_s,
        num_gpu_blocks=num_blocks,
        block_bytes=block_bytes,
        iterations=replica.iterations,
        coalesced_steps=replica.coalesced_steps,
        busy_s=replica.busy_s,
        block_ops=kv.block_ops,
        evictions=pool.stats.evictions,
        cost_model=cost.kind,
        cost_model_reason=cost.reason,
        tiers=tier_report(hierarchy, block_bytes * config.tp),
        links=link_report(hierarchy),
        timeline=timeline.table(),
        hourly_cost_usd=hourly_cost_usd(profile, config),
        prefetched_blocks=kv.prefetched_blocks,
    )


def _requests_table(
    source: _TraceRequests, requests: list[Request], rejected: np.ndarray, hierarchy: Hierarchy
) -> pa.Table:
    def col(name: str, dtype=np.float64) -> np.ndarray:
        return np.fromiter((getattr(r, name) for r in requests), dtype=dtype, count=len(requests))

    arrival = col("arrival_s")
    first = col("first_token_s")
    finish = col("finish_s")
    scheduled = col("scheduled_s")
    output = source.output_tokens
    done = (finish >= 0) & ~rejected
    nan = np.full(len(requests), math.nan)
    ttft = np.where(done, first - arrival, nan)
    e2e = np.where(done, finish - arrival, nan)
    tpot = np.where(done & (output > 1), (finish - first) / np.maximum(output - 1, 1), nan)
    status = np.where(rejected, "rejected", np.where(done, "completed", "unfinished"))
    return pa.table(
        {
            "request_id": source.request_id,
            "session_id": source.session_id,
            "turn": source.turn,
            "status": status,
            "arrival_s": arrival,
            "scheduled_s": np.where(scheduled >= 0, scheduled, nan),
            "first_token_s": np.where(done, first, nan),
            "finish_s": np.where(done, finish, nan),
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "input_tokens": source.input_tokens,
            "cached_tokens": np.maximum(col("cached_tokens", np.int64), 0),
            "output_tokens": output,
            "preemptions": col("preemptions", np.int64),
            "recomputed_tokens": col("recomputed_tokens", np.int64),
            "load_wait_s": col("load_wait_s"),
            "rope_reused_tokens": col("rope_tokens", np.int64),
            **{
                f"{tier.name}_tokens": np.fromiter(
                    (r.lower_tokens[tier.index] if r.lower_tokens else 0 for r in requests),
                    dtype=np.int64,
                    count=len(requests),
                )
                for tier in hierarchy.tiers
            },
        }
    )

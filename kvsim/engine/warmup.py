"""Cache-only warm-up: the requests before a window fill every tier, with no timing.

Before a sharded window's timed engine starts, the requests that arrived earlier are replayed
through the fleet's own KV-cache managers, pools and tier hierarchies, one at a time and at
their arrival times, each served in an instant (`serve_instantly`: the `kvsim mrc` prefix
replay's steps, plus loads from the tiers below and the reply's blocks): no batching, no
iteration costs, no queueing, and moves between tiers take no time (a write lands as it
starts, as it nearly does in the engine, where an iteration outlasts one block's write). The
router still decides where each request goes, seeing the live caches; a router that reads load
sees an estimate (`WarmView`): each request stays running on its replica for its unloaded
service time (its uncached prefill, then its reply at a batch-1 decode step), since nothing
queues in an instant replay. A session's next turn that the timed engine serves is prefetched
towards HBM before its (estimated) arrival, as the engine does while a session thinks.

Only the recent past is replayed (`replay_horizon`): the latest requests before the window
whose blocks, counted once each, fill the fleet's caches (HBM and every tier below) once, and
HBM at least twice (`horizon_blocks`). Under LRU, HBM's contents depend only on the last blocks
that fill it, so older requests change nothing there; HBM's second fill is the slack pinned and
partial blocks take (at exactly one fill hypothesis found an HBM a block off). A lower tier
changes only when a block is written to it, so it may still hold a block from before the
horizon that this replay leaves out, and through the load-or-recompute choice (a block still
in DRAM is loaded, one the replay never wrote there is recomputed) that can change HBM as
well; frequency- or history-based policies remember older
requests too. Both are approximations `benchmarks/bench_shards.py` measures with the rest
(docs/sharding.md: one fill and two of every tier gave the same errors). This keeps a window's
cost bounded by what the caches hold, not by how far into the trace it lies.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

import numpy as np
import simpy

from kvsim.costmodel import CostModel
from kvsim.engine.assemble import Fleet
from kvsim.engine.cluster import LiveView
from kvsim.engine.trace_view import TraceRequests
from kvsim.engine.workload import Workload, prefetch_after
from kvsim.kvcache.manager import KVCacheManager
from kvsim.kvcache.request import Request
from kvsim.routers import ReplicaLoad

#: a budget no prompt reaches: the instant replay admits a prompt whole
WHOLE = 1 << 62
#: decode steps are priced at contexts rounded to this many tokens (a memo key)
CONTEXT_STEP = 256


def serve_instantly(kv: KVCacheManager, req: Request, now_s: float) -> int:
    """Serve `req` in one instant: pin its cached prefix, load what the tiers below hold, give
    it blocks for the rest of its prompt and its reply, offer its full blocks to the prefix
    cache and release them deepest first. Returns its HBM prefix hit in blocks, or -1 when it
    needs more blocks than the pool has (an engine refuses it; the caches are left alone)."""
    plan = kv.lookup(req, WHOLE)
    hit, _, load, _, need = plan
    if hit + need > kv.pool.num_blocks:
        return -1
    kv.admit(req, plan, now_s, True)
    if load:  # the blocks arrive in no time (the tiers below unpin them in this instant)
        kv.loaded(req, hit + len(load), now_s)
    # the prompt's blocks are offered before the reply's are allocated, as the engine commits
    # a prefill before decoding: that allocation may evict an older copy of a prompt block
    req.computed = req.known
    kv.commit(req, now_s)
    # the engine never computes the KV of the last token it samples
    total = req.input_tokens + max(req.output_tokens - 1, 0)
    if total > req.known:
        extra = -(-total // kv.block_size) - req.table.held_blocks - req.table.reserved
        if kv.allocate_slots(req, extra):  # when the pool cannot, the reply is not kept
            req.computed = req.known = total
            kv.commit(req, now_s)
    req.hint = req.reply_hint
    kv.free(req, now_s)
    req.table.drop_chain()
    return hit


class WarmView(LiveView):
    """The live caches, and each replica's load as the requests replayed on it would make it
    if each ran alone for its unloaded service time."""

    def __init__(self, fleet: Fleet, cost: CostModel, chunk: int) -> None:
        super().__init__(fleet.view)
        self.cost = cost
        self.chunk = chunk
        self.block_size = fleet.replicas[0].block_size
        self.capacity = [r.kv.pool.num_blocks for r in fleet.replicas]
        # per replica: (placed at, prompt tokens, uncached ones, reply tokens), not yet priced
        self.pending: list[list[tuple[float, int, int, int]]] = [[] for _ in fleet.replicas]
        self.running: list[list[tuple[float, int]]] = [[] for _ in fleet.replicas]
        self.blocks = [0] * len(fleet.replicas)
        self._steps: dict[int, float] = {}

    def placed(self, replica: int, req: Request, hit_blocks: int) -> None:
        """`req` was replayed on `replica` now; its service time is priced only if a router
        asks for loads (`loads`)."""
        uncached = max(req.input_tokens - hit_blocks * self.block_size, 0)
        self.pending[replica].append((self.now_s, req.input_tokens, uncached, req.output_tokens))

    @property
    def loads(self) -> Sequence[ReplicaLoad]:
        now = self.now_s
        out = []
        for load in super().loads:
            i = load.index
            self._price(i)
            heap = self.running[i]
            while heap and heap[0][0] <= now:
                self.blocks[i] -= heapq.heappop(heap)[1]
            out.append(
                ReplicaLoad(
                    index=i,
                    node=load.node,
                    role=load.role,
                    waiting=0,
                    running=len(heap),
                    prefill_tokens=0,
                    decode_blocks=self.blocks[i],
                    kv_usage=min(self.blocks[i] / self.capacity[i], 1.0),
                    capacity_blocks=self.capacity[i],
                )
            )
        return out

    def _price(self, replica: int) -> None:
        pending = self.pending[replica]
        if not pending:
            return
        cost, bs = self.cost, self.block_size
        for at, prompt, uncached, output in pending:
            context = prompt - uncached
            seconds = cost.prefill_time_s(uncached, context, self.chunk) if uncached else 0.0
            seconds += output * self._step_s(prompt + output // 2)
            blocks = -(-(prompt + output) // bs)
            heapq.heappush(self.running[replica], (at + seconds, blocks))
            self.blocks[replica] += blocks
        pending.clear()

    def _step_s(self, context: int) -> float:
        key = context // CONTEXT_STEP
        seconds = self._steps.get(key)
        if seconds is None:
            seconds = self._steps[key] = self.cost.iteration_time_s([], [key * CONTEXT_STEP])
        return seconds


def warm_up(
    env: simpy.Environment, workload: Workload, fleet: Fleet, rows: np.ndarray
) -> Iterator[simpy.Event]:
    """A SimPy process: replay `rows` of the trace (in arrival order) into the fleet's caches,
    each at its arrival time, routed as the run's router would and served in an instant."""
    config = workload.run.config
    assert config.max_num_batched_tokens is not None  # resolved
    view = WarmView(fleet, fleet.parts.cost, config.max_num_batched_tokens)
    arrival = workload.source.arrival_s
    follows = workload.every_follow
    prefetch = config.prefetch and fleet.replicas[0].kv.hierarchy is not None
    order = rows[np.argsort(arrival[rows], kind="stable")]
    hierarchies = [r.kv.hierarchy for r in fleet.replicas if r.kv.hierarchy is not None]
    for hierarchy in hierarchies:
        hierarchy.instant = True
    yield from _replay(env, workload, fleet, view, order, follows, prefetch)
    for hierarchy in hierarchies:
        hierarchy.instant = False


def _replay(
    env: simpy.Environment,
    workload: Workload,
    fleet: Fleet,
    view: WarmView,
    order: np.ndarray,
    follows: np.ndarray,
    prefetch: bool,
) -> Iterator[simpy.Event]:
    source, cluster = workload.source, fleet.cluster
    timed = workload.timed
    assert timed is not None
    config = workload.run.config
    arrival = source.arrival_s
    for i in order.tolist():
        delay = float(arrival[i]) - env.now
        if delay > 0:
            yield env.timeout(delay)
        req = workload.new_request(i)
        if workload.never_fits(req):
            continue
        target = cluster.warm_choice(req, view)
        replica = fleet.replicas[target]
        hit = serve_instantly(replica.kv, req, env.now)
        if hit < 0:
            continue
        view.placed(target, req, hit)
        nxt = int(follows[i])
        # as the engine does while the session thinks, for a next turn the timed engine
        # serves (one the warm-up serves finds the same blocks below in no time)
        if nxt >= 0 and prefetch and timed[nxt]:
            lead = max(float(arrival[nxt]) - config.prefetch_lead_s - env.now, 0.0)
            prefetch_after(env, lead, replica, workload.new_request(nxt))


def horizon_blocks(fleet: Fleet) -> int:
    """Distinct blocks the warm-up replays back to: what the fleet's caches hold (every
    replica's HBM and node-local tiers, each shared tier once), and at least twice its HBM.

    Why not twice everything, as before: where the horizon binds, one fill of every tier gave
    the same errors as two (docs/sharding.md: within 0.0000 of hit ratio and 0.8 % of p99 on two
    workloads, one whose DRAM serves 44 % of its hits) and halves a late window's slice and
    replay. Why twice HBM: at exactly one fill of a fleet with little below HBM, hypothesis found
    an HBM a block off (pinned and partial blocks take the slack); when the tiers below hold at
    least as much as HBM, one fill of everything is already two of HBM."""
    hbm = below = 0
    shared: set[int] = set()
    for replica in fleet.replicas:
        hbm += replica.kv.pool.num_blocks
        hierarchy = replica.kv.hierarchy
        for tier in hierarchy.tiers if hierarchy is not None else ():
            if tier.shared:
                if id(tier) in shared:
                    continue
                shared.add(id(tier))
            below += tier.capacity_blocks
    return max(hbm + below, 2 * hbm)


#: requests whose blocks `replay_horizon` counts at once (a window can reach back millions)
HORIZON_ROWS = 65_536


def replay_horizon(source: TraceRequests, rows: np.ndarray, blocks: int) -> np.ndarray:
    """The latest of `rows` (by arrival) whose distinct blocks reach `blocks`
    (`horizon_blocks`): all of them when they never do. Counted `HORIZON_ROWS` requests at a
    time against a mark per block id, so the memory is a byte a block id, not a copy of every
    chain."""
    if not rows.size:
        return rows
    order = rows[np.argsort(-source.arrival_s[rows], kind="stable")]  # latest first
    offsets, ids = source.block_ids()
    seen = np.zeros(int(ids.max(initial=0)) + 1, dtype=bool)
    target = blocks
    distinct = 0
    for a in range(0, order.size, HORIZON_ROWS):
        part = order[a : a + HORIZON_ROWS]
        lengths = offsets[part + 1] - offsets[part]
        ends = np.cumsum(lengths)
        if not ends.size or not ends[-1]:
            continue
        starts = np.repeat(offsets[part] - (ends - lengths), lengths)
        stream = ids[starts + np.arange(ends[-1])]
        first = np.zeros(stream.size, dtype=bool)
        first[np.unique(stream, return_index=True)[1]] = True
        first &= ~seen[stream]
        seen[stream] = True
        counts = distinct + np.cumsum(first)[ends - 1]  # distinct blocks of the latest 1, 2, ...
        enough = np.flatnonzero((counts >= target) & (lengths > 0))
        if enough.size:
            return order[: a + enough[0] + 1]
        distinct = int(counts[-1])
    return order

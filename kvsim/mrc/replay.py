"""Cache-only replay of a block access sequence: hit ratios without the engine.

Under ``plain`` semantics each block access is an ordinary cache request (comparable with
libCacheSim): all resident blocks are evictable, and each miss on a full cache evicts a block.
Under ``prefix`` semantics each request goes, one at a time, through the engine's own KV-cache
manager and block pool (kvsim.kvcache), so the replay and the engine cannot drift: its hit is
the leading cached blocks, capped at input - 1 tokens (as in vLLM and SGLang), it pins them,
allocates blocks for the rest of its prompt (evicting what the policy picks), caches its full
blocks and releases them deepest first. A request needing more blocks than the cache holds
cannot be served (an engine refuses it); it counts as all misses and leaves the cache alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvsim.engine.warmup import serve_instantly
from kvsim.kvcache.block_pool import BlockPool
from kvsim.kvcache.hints import TraceHints
from kvsim.kvcache.manager import KVCacheManager
from kvsim.kvcache.request import Request
from kvsim.mrc.heads import replay_heads
from kvsim.policies.base import BlockInfo, EvictionPolicy, FutureFn
from kvsim.policies.ema_head import EmaHead
from kvsim.policies.fifo import FIFO
from kvsim.policies.lru import LRU
from kvsim.policies.oracle import FutureUses
from kvsim.policies.vllm import VLLM
from kvsim.traces import SEGMENT_KINDS, Trace, batch_block_hashes, block_kinds, segment_columns

SEMANTICS = ("plain", "prefix")


@dataclass(frozen=True)
class BlockSequence:
    """A trace as block accesses: request ``i`` owns ``keys[offsets[i]:offsets[i+1]]``."""

    offsets: np.ndarray  # int64, requests + 1
    keys: np.ndarray  # uint64 block hashes
    kinds: np.ndarray  # uint8 codes into SEGMENT_KINDS
    arrival_s: np.ndarray  # float64 per request
    block_size: int
    input_tokens: np.ndarray | None = None
    """Prompt tokens per request (int64); None: each prompt is exactly its full blocks."""
    hints: TraceHints | None = None
    """What policies may know of each request (session, turn, ...); None: nothing."""

    def __len__(self) -> int:
        return int(self.keys.size)

    @classmethod
    def from_trace(cls, trace: Trace, block_size: int) -> BlockSequence:
        cols = segment_columns(trace.table)
        offsets, keys = batch_block_hashes(cols.offsets, cols.hashes, cols.tokens, block_size)
        kinds = np.empty(keys.size, dtype=np.uint8)
        for row in range(len(offsets) - 1):
            lo, hi = cols.offsets[row], cols.offsets[row + 1]
            kinds[offsets[row] : offsets[row + 1]] = block_kinds(
                cols.kinds[lo:hi], cols.tokens[lo:hi], block_size
            )
        arrival = trace.table.column("arrival_s").to_numpy()
        tokens = trace.table.column("input_tokens").to_numpy().astype(np.int64)
        arrival = np.asarray(arrival, dtype=np.float64)
        return cls(offsets, keys, kinds, arrival, block_size, tokens, TraceHints(trace.table))

    def prompt_tokens(self) -> np.ndarray:
        """Prompt tokens per request (full blocks x block size where the trace gives none)."""
        if self.input_tokens is not None:
            return self.input_tokens
        return np.diff(self.offsets) * self.block_size


def next_use(keys: np.ndarray) -> np.ndarray:
    """For each access, the index of the next access to the same key (inf when none)."""
    return FutureUses(keys, np.arange(keys.size)).following()


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    capacity: int
    semantics: str
    accesses: int
    hits: int
    extra: dict[str, float] | None = None
    """Policy-specific figures (ema-head: attention_mass_lost, lossy_hits), added to the JSON."""
    request_hits: np.ndarray | None = None
    """Cached blocks each request hit (prefix semantics only); not in the JSON."""

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "semantics": self.semantics,
            "accesses": self.accesses,
            "hits": self.hits,
            "hit_ratio": self.hit_ratio,
            **(self.extra or {}),
        }


def _fast_lru(keys: list[int], capacity: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    touch, pop = cache.move_to_end, cache.popitem
    hits = 0
    for key in keys:
        if key in cache:
            touch(key)
            hits += 1
        else:
            if len(cache) >= capacity:
                pop(False)
            cache[key] = None
    return hits


def _fast_fifo(keys: list[int], capacity: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    pop = cache.popitem
    hits = 0
    for key in keys:
        if key in cache:
            hits += 1
        else:
            if len(cache) >= capacity:
                pop(False)
            cache[key] = None
    return hits


#: Plain-semantics loops for exact built-in classes (never subclasses or plugins); the contract
#: tests check each against the generic loop.
FAST_PLAIN = {LRU: _fast_lru, VLLM: _fast_lru, FIFO: _fast_fifo}


def replay(
    seq: BlockSequence,
    policy: EvictionPolicy,
    capacity: int,
    semantics: str = "plain",
    *,
    future: np.ndarray | None = None,
    fast: bool = True,
) -> ReplayResult:
    """Replay ``seq`` through ``policy`` in a cache of ``capacity`` blocks.

    ``ema-head`` replays head group by head group (kvsim.mrc.heads) unless its params say
    ``head_granular=False``: then it orders whole blocks, as in the engine."""
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 block, got {capacity}")
    name = policy.name or type(policy).__name__
    if isinstance(policy, EmaHead) and policy.params.head_granular is not False:
        return replay_heads(seq, policy, capacity, semantics)
    if semantics == "prefix":
        return _replay_prefix(seq, policy, capacity, name)
    keys = seq.keys.tolist()
    fast_loop = FAST_PLAIN.get(type(policy)) if fast else None
    if fast_loop is not None:
        return ReplayResult(name, capacity, semantics, len(keys), fast_loop(keys, capacity))

    policy.set_capacity(capacity)
    if policy.needs_future and future is None:
        future = next_use(seq.keys)
    nxt = future.tolist() if future is not None else None
    kinds = [SEGMENT_KINDS[k] if k < len(SEGMENT_KINDS) else "" for k in seq.kinds.tolist()]
    offsets = seq.offsets.tolist()
    arrivals = seq.arrival_s.tolist()
    block_size = seq.block_size
    add, access, evict, miss = policy.add, policy.access, policy.evict, policy.miss
    resident: set[int] = set()
    info = BlockInfo()
    hints = seq.hints
    hits = 0
    for row in range(len(offsets) - 1):
        start, end = offsets[row], offsets[row + 1]
        info.now_s = arrivals[row]
        if hints is not None:  # blocks are added on access here: no reply yet
            info.hint = hints.at(row, replied=False)
        info.request_tokens = (end - start) * block_size
        parent = 0
        for i in range(start, end):
            key = keys[i]
            info.position = i - start
            info.parent = parent
            info.kind = kinds[i]
            if nxt is not None:
                info.next_use = nxt[i]
            if key in resident:
                hits += 1
                access(key, info)
            else:
                miss(key, info)
                if len(resident) >= capacity:
                    resident.difference_update(evict(1))
                add(key, info)
                resident.add(key)
            parent = key
    return ReplayResult(name, capacity, semantics, len(keys), hits)


class _RequestClock:
    """The oracle's view of time in a replay: the index of the request being served. Only that
    request's blocks are asked about, so their next uses are looked up once per request."""

    def __init__(self, seq: BlockSequence) -> None:
        rows = np.repeat(np.arange(len(seq.offsets) - 1), np.diff(seq.offsets))
        self.following = FutureUses(seq.keys, rows.astype(np.float64)).following().tolist()
        self.offsets = seq.offsets.tolist()
        self.keys = seq.keys.tolist()
        self.next: dict[int, float] = {}

    def serve(self, row: int) -> None:
        lo, hi = self.offsets[row], self.offsets[row + 1]
        self.next = dict(zip(self.keys[lo:hi], self.following[lo:hi], strict=True))

    def __call__(self, key: int, now_s: float) -> float:
        return self.next[key]


def cache_only_manager(
    seq: BlockSequence,
    pool: BlockPool,
    load_chain: Callable[[Request], None],
    future: FutureFn | None = None,
) -> KVCacheManager:
    """The engine's KV-cache manager over `pool` with no tiers and no cost model: prompts are
    admitted whole, one request at a time (prefix semantics, and tests that drive the engine)."""
    return KVCacheManager(
        pool,
        None,
        None,
        block_size=seq.block_size,
        chunk_tokens=1 << 62,
        prefix_caching=True,
        rope_reuse=False,
        load_chain=load_chain,
        rerotate_s_per_token=0.0,
        kind_names=SEGMENT_KINDS,
        future=future,
    )


def _replay_prefix(
    seq: BlockSequence, policy: EvictionPolicy, capacity: int, name: str
) -> ReplayResult:
    """Requests one at a time through the engine's KV-cache manager and block pool."""
    pool = BlockPool(capacity, policy)
    clock = _RequestClock(seq) if policy.needs_future else None
    offsets = seq.offsets.tolist()
    keys = seq.keys.tolist()
    kinds = seq.kinds
    chain: list[int] = []

    def load_chain(req: Request) -> None:
        req.table.hashes = chain
        req.table.kinds = kinds[offsets[req.index] : offsets[req.index + 1]]

    kv = cache_only_manager(seq, pool, load_chain, clock)
    tokens = seq.prompt_tokens().tolist()
    arrivals = seq.arrival_s.tolist()
    request_hits = np.zeros(len(offsets) - 1, dtype=np.int64)
    hints = seq.hints
    unserved = 0
    for row in range(len(offsets) - 1):
        chain = keys[offsets[row] : offsets[row + 1]]
        if clock is not None:
            clock.serve(row)
        req = Request(row, tokens[row], 0)
        if hints is not None:  # its reply is known when it releases its blocks
            req.hint = hints.at(row, replied=False)
            req.reply_hint = hints.at(row)
        hit = serve_instantly(kv, req, arrivals[row])
        if hit < 0:  # it could never run: an engine refuses it
            unserved += 1
            continue
        request_hits[row] = hit
    hits = int(request_hits.sum())
    extra: dict[str, float] = {"unserved_requests": unserved}
    return ReplayResult(name, capacity, "prefix", len(keys), hits, extra, request_hits=request_hits)

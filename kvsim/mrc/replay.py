"""Cache-only replay of a block access sequence: hit ratios without the engine.

Every request's blocks are looked up in order. Under ``plain`` semantics each block access is an
ordinary cache request (comparable with libCacheSim). Under ``prefix`` semantics a request stops
hitting at its first missing block, as an engine with prefix caching does: later blocks count as
misses even when resident (they are refreshed, not re-inserted). All resident blocks are
evictable (nothing is pinned), so each miss on a full cache evicts exactly one block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from kvsim.mrc.heads import replay_heads
from kvsim.policies.base import BlockInfo, EvictionPolicy
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
        return cls(offsets, keys, kinds, np.asarray(arrival, dtype=np.float64), block_size)


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
    if isinstance(policy, EmaHead) and policy.params.head_granular:
        return replay_heads(seq, policy, capacity, semantics)
    keys = seq.keys.tolist()
    fast_loop = FAST_PLAIN.get(type(policy)) if fast and semantics == "plain" else None
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
    prefix = semantics == "prefix"
    add, access, discard, forget = policy.add, policy.access, policy.discard, policy.forget
    victim, miss = policy.victim, policy.miss
    resident: set[int] = set()
    info = BlockInfo()
    hits = 0
    for row in range(len(offsets) - 1):
        start, end = offsets[row], offsets[row + 1]
        info.now_s = arrivals[row]
        info.request_tokens = (end - start) * block_size
        parent = 0
        hitting = True
        for i in range(start, end):
            key = keys[i]
            info.position = i - start
            info.parent = parent
            info.kind = kinds[i]
            if nxt is not None:
                info.next_use = nxt[i]
            if key in resident:
                if hitting:
                    hits += 1
                access(key, info)
            else:
                if prefix:
                    hitting = False
                miss(key, info)
                if len(resident) >= capacity:
                    out = victim()
                    discard(out)
                    forget(out)
                    resident.remove(out)
                add(key, info)
                resident.add(key)
            parent = key
    return ReplayResult(name, capacity, semantics, len(keys), hits)

"""A paged KV block pool with automatic prefix caching, after vLLM v1's block pool.

Mechanics reproduced (vLLM docs/design/prefix_caching.md):
- only full blocks are cached, keyed by a hash chained from the prefix (kvsim.traces.blocks);
- a cached block carries a reference count; count 0 means "evictable", ordered by the policy;
- a request's blocks are released deepest-first, so under LRU its deepest block is evicted first;
- a hit on an evictable block pins it again (count 0 -> 1) and removes it from the evictable set.

One deliberate difference: blocks that hold no cached content (partial blocks, duplicates of a
block another request already cached) are fungible, so the pool keeps them as a count rather than
as objects, and hands them out before evicting any cached block. vLLM appends such blocks to the
same free queue as cached ones and may evict a cached block while one of them waits further back.

The pool owns capacity and counters; the policy only orders evictable blocks (STYLE habit 2).
Every operation is O(1) per block plus the policy's cost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, islice, takewhile
from typing import ClassVar

from kvsim.kvcache.compact_tier import CompactLRU
from kvsim.policies.base import BlockInfo, EvictionPolicy, RequestHint


@dataclass(slots=True)
class PoolStats:
    """Counters the pool keeps; policies never touch them."""

    evictions: int = 0


class _Parents(Sequence[int]):
    """The parent hash of each block at `positions` of a chain, computed only if a policy asks."""

    __slots__ = ("_chain", "_positions")

    def __init__(self, chain: list[int], positions: list[int]) -> None:
        self._chain = chain
        self._positions = positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        p = self._positions[i]
        return self._chain[p - 1] if p else 0

    def __iter__(self):  # type: ignore[override]
        chain = self._chain
        return (chain[p - 1] if p else 0 for p in self._positions)


class BlockPool:
    """`num_blocks` physical blocks: free (uncached), cached (pinned or evictable), or in use."""

    head_granular: ClassVar[bool] = False
    """True for kvsim.kvcache.group_pool.GroupPool (frees KV-head groups, not whole blocks)."""
    lossy_blocks = 0
    """Blocks of the last ``acquire`` that hit missing KV-head groups (always 0 here)."""
    mass_lost = 0.0
    """Attention share those missing groups held (always 0 here)."""

    def __init__(
        self, num_blocks: int, policy: EvictionPolicy, block_bytes: int = 1, journal: bool = False
    ) -> None:
        """`journal`: record every block that becomes cached or is evicted, for a view that
        replays them at each refresh (kvsim.engine.cluster.CacheView's snapshots)."""
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self.policy = policy
        self.free_uncached = num_blocks
        self.refs: dict[int, int] = {}  # block hash -> reference count (0 = evictable)
        self.stats = PoolStats()
        self.version = 0  # bumped whenever a block's cached or evictable state may change
        self.info = BlockInfo(size_bytes=block_bytes)  # reused; valid only during a policy call
        policy.set_capacity(num_blocks)
        kind = type(policy)
        # Policies that read per-block info go through the base class's batch loops; only they
        # need the chain's block kinds, and only they get `miss` calls (an unread no-op otherwise).
        self.describes = (
            kind.add_many is EvictionPolicy.add_many
            or kind.pin_many is EvictionPolicy.pin_many
            or kind.reads_info
        )
        self.reports_misses = kind.miss is not EvictionPolicy.miss
        # set by a memory hierarchy below HBM: evicted blocks are written down, and under
        # write-through computed ones too
        self.on_evict: Callable[[list[int]], None] | None = None
        self.on_register: Callable[[list[int]], None] | None = None
        # kept when a router sees stale snapshots: (cached?, keys) for every change, replayed
        # into the router's copy at each refresh
        self.journal: list[tuple[bool, list[int]]] | None = [] if journal else None

    def describe(
        self, kinds: Sequence[int] | None, request_tokens: int, hint: RequestHint | None = None
    ) -> None:
        """Name the request whose blocks the next calls hand over (for policies that read it)."""
        self.info.chain_kinds = kinds
        self.info.request_tokens = request_tokens
        self.info.hint = hint

    # -- queries ---------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks an allocation can get right now: free ones plus evictable cached ones."""
        return self.free_uncached + len(self.policy)

    @property
    def used(self) -> int:
        """Blocks holding data a running request needs (pinned cached + uncached in use)."""
        return self.num_blocks - self.available

    def cached_prefix(self, hashes: list[int], limit: int) -> tuple[int, int]:
        """(leading blocks of `hashes[:limit]` that are cached, how many of those are evictable).

        A hit stops at the first missing block: a block whose prefix is gone is useless.
        The walk runs in C (takewhile over the dict's membership test)."""
        hit = len(list(takewhile(self.refs.__contains__, islice(hashes, limit))))
        if not hit:
            return 0, 0
        return hit, list(map(self.refs.__getitem__, hashes[:hit])).count(0)

    # -- operations ------------------------------------------------------------------------------
    def acquire(self, hashes: list[int], count: int, now_s: float) -> None:
        """Pin the first `count` blocks of `hashes` (all cached) for a request that hit them."""
        if not count:
            return
        self.version += 1
        refs = self.refs
        keys = hashes[:count]
        counts = list(map(refs.__getitem__, keys))
        self.info.now_s = now_s
        self.policy.pin_many(keys, [c == 0 for c in counts], self.info)
        refs.update(zip(keys, [c + 1 for c in counts], strict=True))

    def allocate(self, count: int) -> bool:
        """Take `count` blocks, evicting cached ones the policy picks; False if impossible."""
        if count > self.free_uncached + len(self.policy):
            return False
        take = min(count, self.free_uncached)
        self.free_uncached -= take
        count -= take
        if count:
            self.version += 1
            refs = self.refs
            victims = self.policy.evict(count)
            deque(map(refs.__delitem__, victims), maxlen=0)  # at C speed
            # a policy that frees whole groups (sglang: radix nodes) may free more than asked
            self.free_uncached += len(victims) - count
            self.stats.evictions += len(victims)
            if self.on_evict is not None:
                self.on_evict(victims)
            if self.journal is not None:
                self.journal.append((False, victims))
        return True

    def register(self, hashes: list[int], start: int, end: int, now_s: float) -> list[int]:
        """Blocks `start..end-1` of `hashes` just filled; cache each pinned (ref 1) and return
        the positions cached. A block whose content another request already cached stays an
        uncached duplicate, as in vLLM, and is freed as such."""
        self.version += 1
        refs = self.refs
        keys = hashes[start:end]
        if self.reports_misses:
            info = self.info
            info.now_s = now_s
            miss = self.policy.miss
            for position in range(start, end):
                key = hashes[position]
                if key not in refs:
                    miss(key, info.at(key, position, hashes[position - 1] if position else 0))
        if refs.keys().isdisjoint(keys):  # the common case, tested in C
            refs.update(dict.fromkeys(keys, 1))
            fresh = list(range(start, end))
        else:
            fresh = [p for p in range(start, end) if hashes[p] not in refs]
            refs.update((hashes[p], 1) for p in fresh)
        if self.on_register is not None and fresh:
            self.on_register([hashes[p] for p in fresh])
        if self.journal is not None and fresh:
            self.journal.append((True, [hashes[p] for p in fresh]))
        return fresh

    def release(self, hashes: list[int], positions: list[int], uncached: int, now_s: float) -> None:
        """Unpin cached blocks at `positions` of `hashes` deepest-first, and free `uncached`."""
        self.free_uncached += uncached
        if not positions:
            return
        self.version += 1
        refs = self.refs
        at = positions[::-1]
        if at[0] - at[-1] + 1 == len(at):  # one contiguous run (the usual case): slice it
            keys = hashes[at[-1] : at[0] + 1][::-1]
        else:
            keys = [hashes[p] for p in at]
        counts = list(map(refs.__getitem__, keys))
        if counts.count(1) == len(counts):  # the common case: nobody else holds them
            refs.update(dict.fromkeys(keys, 0))
            freed, freed_at = keys, at
        else:
            refs.update(zip(keys, [c - 1 for c in counts], strict=True))
            zero = [c == 1 for c in counts]
            freed, freed_at = list(compress(keys, zero)), list(compress(at, zero))
        if freed:
            self.info.now_s = now_s
            parents = _Parents(hashes, freed_at)
            try:
                self.policy.add_many(freed, freed_at, parents, self.info)
            except OverflowError:
                if type(self.policy) is not CompactLRU:
                    raise
                # a key no int32 holds (a hand-made hash, a salted id): back to LRU's dicts
                self.policy = self.policy.to_lru()
                self.policy.add_many(freed, freed_at, parents, self.info)

    def check(self) -> None:
        """Assert the pool's accounting invariants (tests call this)."""
        evictable = sum(1 for r in self.refs.values() if r == 0)
        assert evictable == len(self.policy), (evictable, len(self.policy))
        assert 0 <= self.free_uncached <= self.num_blocks
        assert self.free_uncached + len(self.refs) <= self.num_blocks
        assert all(r >= 0 for r in self.refs.values())

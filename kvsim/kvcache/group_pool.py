"""A block pool that frees KV-head groups one by one, for head-granular policies (``ema-head``).

Our reconstruction of head-granular freeing inside the engine (docs/policies.md, "ema-head";
the public design it follows frees per head, shared/reference/algorithms.md). It keeps the
interface of kvsim.kvcache.block_pool.BlockPool, in blocks, so the manager and the scheduler do
not change, and the whole-block pool keeps its fast paths untouched: the engine builds this
class only when the HBM policy's ``head_groups()`` is above 1.

- Capacity is ``num_blocks × G`` group slots (G = head groups). A cached block carries a bit
  mask of its resident groups; ``refs`` holds every block with at least one group.
- Eviction frees single (block, group) slots, the lowest ``GroupScorer.key_of`` first (ties: the
  deeper block, then the lower hash, then the lower group, as kvsim.mrc.heads). A block leaves
  when its last group does.
- A prefix hit stops at the first block missing a group, unless the attention share of its missing
  groups is at most the policy's ``tolerate_loss``: a lossy hit, the request runs without them.
  ``acquire`` leaves the count and the mass of the last hit in ``lossy_blocks`` / ``mass_lost``.
- A block past the hit is recomputed in full into freshly allocated slots (as vLLM recomputes
  into new blocks). When it is registered and a copy is still cached, partial or whole, the
  copy takes the request's missing groups and the request's spare slots go back to the free
  count: the missing groups are re-inserted, never held twice.
- Below HBM a block is written down whole when it first loses a group (it is still whole then);
  a lower tier never holds part of a block, and to the hierarchy a block is in HBM only while it
  is whole (``holds_whole``), so an exclusive hierarchy keeps the copy of a partial one.

Scores are touched when a request hits a block (``acquire``) or registers it, and the group
order is set when the block becomes evictable (``release``), from those scores.
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import ClassVar, cast

from kvsim.kvcache.block_pool import BlockPool
from kvsim.policies.base import EvictionPolicy, GroupScorer

# a heap entry: (ordering key, -position, block hash, group)
_Entry = tuple[float, int, int, int]


class GroupPool(BlockPool):
    """`num_blocks` blocks of `groups` slots each; evictable blocks lose groups one by one."""

    head_granular: ClassVar[bool] = True

    def __init__(
        self, num_blocks: int, policy: EvictionPolicy, block_bytes: int = 1, journal: bool = False
    ) -> None:
        super().__init__(num_blocks, policy, block_bytes, journal)
        groups = policy.head_groups()
        if groups < 2:
            raise ValueError("a group pool needs a policy with head_groups() >= 2")
        self.scorer = cast(GroupScorer, policy)
        self.groups = groups
        self.full = (1 << groups) - 1
        self.free_slots = num_blocks * groups  # slots holding no cached group
        self.evictable_slots = 0  # resident groups of blocks nobody pins
        self.masks: dict[int, int] = {}  # block hash -> resident groups
        self.scores: dict[int, tuple[float, list[float]]] = {}  # hash -> (touched at, per group)
        self.positions: dict[int, int] = {}  # hash -> its position in its chain
        self.heap: list[_Entry] = []
        self.live: dict[tuple[int, int], _Entry] = {}  # (hash, group) -> its current entry
        self.group_evictions = 0
        self.lossy_blocks = 0  # of the last acquire
        self.mass_lost = 0.0
        self.describes = True
        # so the manager names the request before every register (the policy's `miss` is a no-op)
        self.reports_misses = True

    # -- queries ---------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        return (self.free_slots + self.evictable_slots) // self.groups

    @property
    def used(self) -> int:
        return self.num_blocks - self.available

    def holds_whole(self, key: int) -> bool:
        """Whether every group of `key` is here (an exclusive hierarchy keeps a copy below of a
        block HBM holds only part of)."""
        return self.masks.get(key) == self.full

    def lost_share(self, mask: int, position: int) -> float:
        """Share of the current request's attention (``describe``) on the groups of the block at
        `position` missing from `mask`: the mean over groups of each group's attention."""
        info = self.info
        info.position = position
        attention = self.scorer.group_attention(info)
        lost = sum(a for g, a in enumerate(attention) if not mask >> g & 1)
        return lost / self.groups

    def cached_prefix(self, hashes: list[int], limit: int) -> tuple[int, int]:
        """(leading blocks of `hashes[:limit]` that hit, wholly or lossily; how many blocks of
        room pinning them takes from `available`). Needs the request named (``describe``)."""
        masks, refs, full = self.masks, self.refs, self.full
        tolerate = self.scorer.tolerate_loss
        hit = pinned = 0
        for position, key in enumerate(islice(hashes, limit)):
            mask = masks.get(key)
            if mask is None:
                break
            if mask != full and (tolerate <= 0 or self.lost_share(mask, position) > tolerate):
                break
            hit += 1
            if not refs[key]:
                pinned += mask.bit_count()
        if not hit:
            return 0, 0
        left = (self.free_slots + self.evictable_slots - pinned) // self.groups
        return hit, self.available - left

    # -- operations ------------------------------------------------------------------------------
    def _touch(self, key: int, position: int) -> None:
        old = self.scores.get(key)
        info = self.info
        info.position = position
        now = info.now_s
        touched = self.scorer.touch(old[1] if old else None, old[0] if old else now, info)
        self.scores[key] = (now, touched)
        self.positions[key] = position

    def _pin(self, key: int, mask: int) -> None:
        """An evictable block is pinned again: its groups leave the order."""
        self.evictable_slots -= mask.bit_count()
        live = self.live
        for g in range(self.groups):
            if mask >> g & 1:
                del live[(key, g)]

    def acquire(self, hashes: list[int], count: int, now_s: float) -> None:
        """Pin the first `count` blocks (a hit found by ``cached_prefix``) and touch their
        scores; the lossy ones' count and attention mass lost go in ``lossy_blocks`` and
        ``mass_lost``."""
        self.lossy_blocks = 0
        self.mass_lost = 0.0
        if not count:
            return
        self.version += 1
        refs, masks, full = self.refs, self.masks, self.full
        self.info.now_s = now_s
        for position in range(count):
            key = hashes[position]
            mask = masks[key]
            if mask != full:
                self.lossy_blocks += 1
                self.mass_lost += self.lost_share(mask, position)
            ref = refs[key]
            if not ref:
                self._pin(key, mask)
            refs[key] = ref + 1
            self._touch(key, position)

    def allocate(self, count: int) -> bool:
        """Take `count` blocks' worth of slots, evicting the lowest-keyed groups; False if the
        free and evictable slots together are too few."""
        slots = count * self.groups
        if slots > self.free_slots + self.evictable_slots:
            return False
        take = min(slots, self.free_slots)
        self.free_slots -= take
        slots -= take
        if slots:
            self.version += 1
            self._evict(slots)
        return True

    def _evict(self, slots: int) -> None:
        """Free `slots` evictable group slots, lowest key first (the free count is unchanged:
        each freed slot goes straight to the allocation that asked)."""
        heap, live, masks, full = self.heap, self.live, self.masks, self.full
        pop = heapq.heappop
        written: list[int] = []  # whole blocks losing their first group: written down
        gone: list[int] = []  # blocks whose last group left
        self.evictable_slots -= slots
        self.group_evictions += slots
        while slots:
            entry = pop(heap)
            key, group = entry[2], entry[3]
            # stale: re-ordered, pinned or evicted since. Compared by value, as the compiled
            # build (kvsim.compiled) copies tuples; a stale entry equal to the live one pops
            # right beside it, so which of the two is taken changes nothing.
            if live.get((key, group)) != entry:
                continue
            del live[(key, group)]
            slots -= 1
            mask = masks[key]
            if mask == full:
                written.append(key)
            mask &= ~(1 << group)
            if mask:
                masks[key] = mask
            else:
                del masks[key], self.refs[key], self.scores[key], self.positions[key]
                gone.append(key)
        self.stats.evictions += len(gone)
        if self.on_evict is not None and written:
            self.on_evict(written)
        if self.journal is not None and gone:
            self.journal.append((False, gone))

    def register(self, hashes: list[int], start: int, end: int, now_s: float) -> list[int]:
        """Blocks `start..end-1` were just computed into slots this request allocated: cache
        each pinned and whole, and return their positions. A copy still cached takes the missing
        groups; the request's other slots for that block go back to the free count."""
        self.version += 1
        refs, masks, full = self.refs, self.masks, self.full
        self.info.now_s = now_s
        fresh = []
        for position in range(start, end):
            key = hashes[position]
            mask = masks.get(key)
            if mask is None:
                refs[key] = 1
                fresh.append(key)
            else:
                ref = refs[key]
                if not ref:
                    self._pin(key, mask)
                refs[key] = ref + 1
                self.free_slots += mask.bit_count()
            masks[key] = full
            self._touch(key, position)
        if self.on_register is not None and fresh:
            self.on_register(fresh)
        if self.journal is not None and fresh:
            self.journal.append((True, fresh))
        return list(range(start, end))

    def release(self, hashes: list[int], positions: list[int], uncached: int, now_s: float) -> None:
        """Unpin cached blocks at `positions` deepest first; each whose last user leaves puts its
        resident groups in the order. Free `uncached` blocks' slots."""
        self.free_slots += uncached * self.groups
        if not positions:
            return
        self.version += 1
        refs, masks, scores, live = self.refs, self.masks, self.scores, self.live
        key_of, push, heap = self.scorer.key_of, heapq.heappush, self.heap
        for position in reversed(positions):
            key = hashes[position]
            ref = refs[key] - 1
            refs[key] = ref
            if ref:
                continue
            mask = masks[key]
            self.evictable_slots += mask.bit_count()
            touched, group_scores = scores[key]
            for g in range(self.groups):
                if mask >> g & 1:
                    entry = (key_of(group_scores[g], touched), -position, key, g)
                    live[(key, g)] = entry
                    push(heap, entry)
        if len(heap) > 2 * len(live) + 4096:
            self.heap = list(live.values())
            heapq.heapify(self.heap)

    def check(self) -> None:
        """Assert the slot accounting (tests call this): every slot is free, resident in exactly
        one block's mask, or allocated to a running request; none over capacity."""
        masks, refs = self.masks, self.refs
        assert set(masks) == set(refs) == set(self.scores)
        assert all(0 < m <= self.full for m in masks.values())
        assert all(r >= 0 for r in refs.values())
        evictable = sum(m.bit_count() for k, m in masks.items() if not refs[k])
        assert evictable == self.evictable_slots == len(self.live), (
            evictable,
            self.evictable_slots,
            len(self.live),
        )
        for (key, group), entry in self.live.items():
            assert not refs[key] and masks[key] >> group & 1 and entry[2:] == (key, group)
        resident = sum(m.bit_count() for m in masks.values())
        assert self.free_slots >= 0
        assert self.free_slots + resident <= self.num_blocks * self.groups

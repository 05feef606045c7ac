"""The tiers below HBM: where a KV block goes when HBM evicts it, and how it comes back.

HBM is the engine's block pool; this module holds the lower tiers (dram, cxl, nvme, rdma, pfs,
any subset, fastest first). Each tier owns its capacity, counters and its own eviction-policy
instance (STYLE habit 2); each has one `Link` to HBM, shared by loads and write-backs.

- Demotion: a block HBM evicts is written to the first tier that admits it (write-back); with
  write-through, a block is written down as soon as HBM computes it, so eviction costs nothing.
  A tier that is full evicts by its policy, and the victim moves to the next tier down or, from the
  last tier, is dropped.
- Inclusive hierarchy: a block loaded back into HBM keeps its copy below (a second eviction writes
  nothing). Exclusive: the copy is removed when the load starts, so a block lives in one tier.
- Admission per tier: `all`, or `second-chance` (admit a block only the second time it arrives
  within a window as large as the tier, a doorkeeper that keeps one-time blocks out).
- Space for a write is reserved when the write starts, so no tier ever holds more than its
  capacity, even counting blocks in flight.
- Shared tiers (a cluster's RDMA pool or parallel filesystem) are one `LowerTier` in every
  replica's hierarchy, with one placement map (`LowerTier.where`) that all of them read: a block
  one node writes there, every node finds. A block already in a shared tier is not written again.
- Node-local tiers keep their placement and, under LRU, their order compactly
  (kvsim.kvcache.compact_tier: paged bitsets over the engine's dense block ids, an int32
  queue), not as per-block Python objects; keys that are not dense ids move the hierarchy to
  dicts (the same results, more memory).

Byte conservation, which the tests check:
    written into tiers = resident + dropped from the last tier + removed by exclusive loads
                         + writes superseded (the block came back to HBM while being written).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import filterfalse, islice

import numpy as np
import simpy

from kvsim.kvcache.compact_tier import (
    CompactLRU,
    DensePlacement,
    DictPlacement,
    consume,
    dense,
)
from kvsim.kvcache.link import Link
from kvsim.policies.base import BlockInfo, EvictionPolicy
from kvsim.policies.lru import LRU

ADMISSIONS = ("all", "second-chance")
Placement = DensePlacement | DictPlacement


@dataclass(slots=True)
class TierStats:
    """Counters of one lower tier, in blocks (bytes = blocks x block bytes)."""

    written_in: int = 0  # blocks whose write into this tier started
    resident_peak: int = 0
    loaded_out: int = 0  # blocks read back to HBM
    demoted_out: int = 0  # blocks this tier evicted towards the next tier
    dropped: int = 0  # blocks this tier evicted with nowhere to go
    removed_exclusive: int = 0  # blocks removed because an exclusive load took them
    superseded: int = 0  # writes that landed after the block was back in HBM (exclusive)
    refused: int = 0  # blocks not admitted
    served_tokens: int = 0  # prompt tokens requests got from this tier


@dataclass
class LowerTier:
    """One tier below HBM: its capacity in blocks, resident blocks, policy and link."""

    name: str
    index: int
    capacity_blocks: int
    policy: EvictionPolicy
    link: Link
    admission: str = "all"
    bounce: Link | None = None  # nvme without GPUDirect Storage: second hop through DRAM
    pieces_per_block: int = 1  # DMA copies that move one block (its layout in HBM)
    resident: int = 0  # blocks whose copy has landed here
    pinned: dict[int, int] = field(default_factory=dict)  # blocks being read: not evictable
    incoming: int = 0  # blocks reserved by writes in flight
    doorkeeper: dict[int, None] = field(default_factory=dict)
    stats: TierStats = field(default_factory=TierStats)
    # placement map: the replica's own for node-local tiers (set by the hierarchy: a compact
    # `Placement`), one dict for the whole cluster for a shared tier (given at construction)
    where: dict[int, int] | Placement | None = None
    shared: bool = False

    def __post_init__(self) -> None:
        self.policy.set_capacity(self.capacity_blocks)
        self.shared = self.where is not None

    @property
    def used(self) -> int:
        return self.resident + self.incoming

    def admits(self, key: int) -> bool:
        if self.capacity_blocks < 1:
            return False
        if self.admission == "all":
            return True
        if key in self.doorkeeper:
            del self.doorkeeper[key]
            return True
        self.doorkeeper[key] = None
        if len(self.doorkeeper) > self.capacity_blocks:
            del self.doorkeeper[next(iter(self.doorkeeper))]
        return False


class Hierarchy:
    """The lower tiers of one replica and the moves between them and HBM."""

    def __init__(
        self,
        env: simpy.Environment,
        tiers: list[LowerTier],
        block_bytes: int,
        *,
        write_through: bool = False,
        inclusive: bool = True,
        in_hbm: Callable[[int], bool] = lambda key: False,
        source: int = 0,
    ) -> None:
        self.env = env
        self.source = source  # who this replica is on a link that caps each source
        self.tiers = tiers
        self.block_bytes = block_bytes
        self.write_through = write_through
        self.inclusive = inclusive
        self.in_hbm = in_hbm
        # block id -> t (its copy is in tier t) or ~t (it is being written into tier t), for
        # the node-local tiers: bitsets over dense ids until a key is not one, then a dict
        self.where: Placement = DensePlacement(len(tiers))
        shared = [t for t in tiers if t.shared]
        # a cluster's shared tiers keep their own placement map (a dict), read after this
        # replica's
        self.shared_where: dict[int, int] | None = shared[0].where if shared else None  # type: ignore[assignment]
        for tier in tiers:
            if not tier.shared:
                tier.where = self.where
                if type(tier.policy) is LRU and not len(tier.policy):
                    tier.policy = CompactLRU()  # the same victims, 4 bytes a block
            else:
                assert tier.where is self.shared_where, "shared tiers share one placement map"
        self.info = BlockInfo(size_bytes=block_bytes)
        self._held: list[int] | None = None  # write-backs collected by hold_writes
        # moves take no time (a sharded window's cache-only warm-up, kvsim.engine.warmup):
        # writes land at once, loads end in the same instant
        self.instant = False
        # bumped whenever the placement map changes: a queued request re-looked-up before
        # anything moved gets its last `chain` again instead of a walk (node-local tiers only)
        self.version = 0
        self._chain_memo: tuple[list[int], int, int, int, list[int]] | None = None

    def __bool__(self) -> bool:
        return bool(self.tiers)

    # -- lookups -----------------------------------------------------------------------------------
    def chain(self, hashes: list[int], start: int, limit: int) -> list[int]:
        """Tier index of each block `start, start+1, ...` of a chain found below HBM, up to the
        first block found nowhere (a block whose prefix is missing is useless)."""
        shared = self.shared_where
        if shared is None:
            memo = self._chain_memo
            if memo is not None and memo[0] is hashes and memo[1:4] == (start, limit, self.version):
                return list(memo[4])
            found = self.where.prefix(hashes, start, limit)
            self._chain_memo = (hashes, start, limit, self.version, found)
            return list(found)
        local = self.where
        out = []
        for key in islice(hashes, start, limit):
            t = local.get(key, -1)
            if t < 0:
                t = shared.get(key, -1)
                if t < 0:
                    break
            out.append(t)
        return out

    def load_estimate_s(self, tiers: list[int]) -> np.ndarray:
        """Cumulative seconds to load the first 1, 2, ... of these blocks, on the links as they
        are loaded now (a link with k loads in flight gives a new one 1/(k+1); write-backs
        yield to loads); each tier's latency is paid once, each DMA copy's overhead per block."""
        per_block = np.empty(len(self.tiers))
        latency = np.empty(len(self.tiers))
        for tier in self.tiers:
            link = tier.link
            if link.overhead_s > 0 or link.source_cap_bytes_per_s is not None:
                work = link.work_s(self.block_bytes, tier.pieces_per_block)
                cost = link.read_slowdown(self.source) * work
            else:
                cost = (link.reads_in_flight + 1) * self.block_bytes / link.read_bytes_per_s
            if tier.bounce is not None:
                bounce = tier.bounce
                if bounce.overhead_s > 0 or bounce.source_cap_bytes_per_s is not None:
                    work = bounce.work_s(self.block_bytes, tier.pieces_per_block)
                    cost += bounce.read_slowdown(self.source) * work
                else:
                    cost += (
                        (bounce.reads_in_flight + 1) * self.block_bytes / bounce.read_bytes_per_s
                    )
            per_block[tier.index] = cost
            latency[tier.index] = link.latency_s
        if tiers.count(tiers[0]) == len(tiers):  # the usual case: all from one tier
            steps = np.full(len(tiers), per_block[tiers[0]])
            steps[0] += latency[tiers[0]]
            return np.cumsum(steps)
        index = np.asarray(tiers)
        steps = per_block[index]
        used, first = np.unique(index, return_index=True)
        np.add.at(steps, first, latency[used])
        return np.cumsum(steps)

    # -- loads ---------------------------------------------------------------------------------
    def load(self, keys: list[int], tiers: list[int], tokens: list[int]) -> simpy.Event:
        """Read `keys` (held in `tiers`) into HBM; the event fires when all have arrived.
        `tokens[i]` is the prompt tokens block i serves (for the per-tier hit ratio)."""
        groups: dict[int, list[int]] = {}
        served: dict[int, int] = {}
        if tiers.count(tiers[0]) == len(tiers):  # the usual case: one tier, no Python loop
            groups[tiers[0]] = list(keys)
            served[tiers[0]] = sum(tokens)
        else:
            for key, t, n in zip(keys, tiers, tokens, strict=True):
                groups.setdefault(t, []).append(key)
                served[t] = served.get(t, 0) + n
        events = []
        for t, group in groups.items():
            tier = self.tiers[t]
            tier.stats.served_tokens += served[t]
            self._pin_many(tier, group)
            tier.stats.loaded_out += len(group)
            nbytes = len(group) * self.block_bytes
            pieces = len(group) * tier.pieces_per_block
            if self.instant:
                done = self.env.event().succeed()
            else:
                done = tier.link.transfer(nbytes, pieces=pieces, source=self.source)
                if tier.bounce is not None:
                    done = self._then(done, tier.bounce, nbytes, pieces)
            done.callbacks.append(lambda _ev, tier=tier, group=group: self._loaded(tier, group))  # type: ignore[misc]
            events.append(done)
        return simpy.AllOf(self.env, events)

    def _then(self, first: simpy.Event, link: Link, nbytes: int, pieces: int) -> simpy.Event:
        """A second hop that starts when `first` is done (the NVMe bounce through DRAM)."""
        done = self.env.event()

        def hop(_ev: simpy.Event) -> None:
            moved = link.transfer(nbytes, pieces=pieces, source=self.source)
            moved.callbacks.append(lambda _e: done.succeed())  # type: ignore[arg-type]

        first.callbacks.append(hop)
        return done

    def _pin_many(self, tier: LowerTier, keys: list[int]) -> None:
        """Pin `keys` in `tier` while they are read: the first pin takes a block out of the
        policy's evictable set. Blocks nobody is reading yet (the usual case) are pinned in one
        batch; each tier has its own policy, so pinning tier by tier changes no order."""
        pinned = tier.pinned
        if pinned.keys().isdisjoint(keys) and len(set(keys)) == len(keys):
            tier.policy.discard_many(keys)
            pinned.update(dict.fromkeys(keys, 1))
            return
        for key in keys:
            count = pinned.get(key, 0)
            if count == 0:
                tier.policy.discard(key)
            pinned[key] = count + 1

    def _loaded(self, tier: LowerTier, keys: list[int]) -> None:
        """`keys` arrived in HBM: unpin them; the last reader of a block makes it evictable
        again below (inclusive) or removes its copy (exclusive)."""
        info = self.info
        info.now_s = self.env.now
        pinned = tier.pinned
        counts = list(map(pinned.__getitem__, keys))
        # every count 1: one reader each (the usual case), and no key twice in `keys` (this
        # load pinned each occurrence, so a repeated key would count at least 2)
        if counts.count(1) == len(counts):
            consume(map(pinned.__delitem__, keys))
            free = keys
        else:
            free = []
            for key in keys:
                count = pinned[key] - 1
                if count:
                    pinned[key] = count
                else:
                    del pinned[key]
                    free.append(key)
        if not self.inclusive:
            for key in free:
                self._remove(tier, key)
                tier.stats.removed_exclusive += 1
        elif info.future is None:
            zeros = [0] * len(free)
            tier.policy.add_many(free, zeros, zeros, info)
        else:
            for key in free:
                self._add(tier, key)

    # -- writes ----------------------------------------------------------------------------------
    def evicted_from_hbm(self, keys: list[int]) -> None:
        """HBM evicted these blocks: write down the ones no tier below holds (write-back)."""
        if not self.tiers or self.write_through:
            return
        if self._held is not None:
            self._held.extend(keys)
            return
        self._write(0, self._not_below(keys))

    def hold_writes(self) -> None:
        """Collect write-backs until `release_writes`: blocks evicted one by one in the same
        instant (a decode step that crosses block boundaries in many requests) go down as one
        transfer per tier, not one each. Nothing reads the placement map in between."""
        self._held = []

    def release_writes(self) -> None:
        held, self._held = self._held, None
        if held:
            self._write(0, self._not_below(held))

    def computed_in_hbm(self, keys: list[int]) -> None:
        """HBM just computed (or loaded) these blocks. Write-through copies them down now; an
        exclusive hierarchy drops a copy below, so the block lives in one tier only."""
        if not self.tiers:
            return
        where = self.where
        shared = self.shared_where
        if self.write_through:
            self._write(0, self._not_below(keys))
        elif not self.inclusive:
            for key in keys:
                t = where.get(key, -1)
                if t < 0 and shared is not None:
                    t = shared.get(key, -1)
                if t < 0:
                    continue
                tier = self.tiers[t]
                if key not in tier.pinned:
                    tier.policy.discard(key)
                    self._remove(tier, key)
                    tier.stats.removed_exclusive += 1

    def _not_below(self, keys: list[int]) -> list[int]:
        """The keys no tier holds or is being written (so a block is never written twice)."""
        out = self.where.not_held(keys)
        if self.shared_where is not None:
            out = list(filterfalse(self.shared_where.__contains__, out))
        return out

    def _write(self, start: int, keys: list[int]) -> None:
        """Write `keys` into the first tier from `start` down that admits each; one transfer
        per destination tier."""
        pending = keys
        for t in range(start, len(self.tiers)):
            if not pending:
                return
            tier = self.tiers[t]
            if tier.admission == "all" and tier.capacity_blocks > 0:
                admitted = pending
            else:
                admitted = [k for k in pending if tier.admits(k)]
            if admitted:
                tier.stats.refused += len(pending) - len(admitted)
                self._store(tier, admitted)
                if len(admitted) == len(pending):  # the usual case: the first tier took all
                    return
                admitted_set = set(admitted)
                pending = [k for k in pending if k not in admitted_set]
            else:
                tier.stats.refused += len(pending)
        # blocks no tier admitted are simply gone, as from an HBM-only replica

    def _store(self, tier: LowerTier, keys: list[int]) -> None:
        if tier.shared:  # another node may have put it there already
            keys = list(filterfalse(tier.where.__contains__, keys))  # type: ignore[union-attr,operator]
        elif self.where.dense and not dense(keys):
            self._to_dicts()
        overflow = tier.used + len(keys) - tier.capacity_blocks
        if overflow > 0:
            self._make_room(tier, overflow)
        room = tier.capacity_blocks - tier.used
        if room < len(keys):  # the rest of the tier is pinned by loads: keep what fits
            tier.stats.refused += len(keys) - room
            keys = keys[:room]
        if not keys:
            return
        tier.incoming += len(keys)
        tier.stats.written_in += len(keys)
        self.version += 1
        if tier.shared:
            tier.where.update(dict.fromkeys(keys, ~tier.index))  # type: ignore[union-attr]
        else:
            self.where.write(keys, tier.index)
        if self.instant:
            self._landed(tier, keys)
            return
        done = tier.link.transfer(
            len(keys) * self.block_bytes,
            write=True,
            pieces=len(keys) * tier.pieces_per_block,
            source=self.source,
        )
        done.callbacks.append(lambda _ev: self._landed(tier, keys))

    def _to_dicts(self) -> None:
        """Move the node-local tiers to dicts: a key that is not a dense block id arrived."""
        self.where = DictPlacement(self.where.as_dict())
        for tier in self.tiers:
            if not tier.shared:
                tier.where = self.where
                if isinstance(tier.policy, CompactLRU):
                    tier.policy = tier.policy.to_lru()

    def _landed(self, tier: LowerTier, keys: list[int]) -> None:
        shared = tier.shared
        tier.incoming -= len(keys)
        self.info.now_s = self.env.now
        self.version += 1
        if not self.inclusive:
            back = [k for k in keys if self.in_hbm(k)]
            if back:
                # back in HBM before its copy landed: keeping it would put it in two tiers
                if shared:
                    consume(map(tier.where.__delitem__, back))  # type: ignore[union-attr]
                else:
                    self.where.cancel(back)
                tier.stats.superseded += len(back)
                gone = set(back)
                keys = [k for k in keys if k not in gone]
        tier.resident += len(keys)
        if shared:
            tier.where.update(dict.fromkeys(keys, tier.index))  # type: ignore[union-attr]
        else:
            self.where.land(keys, tier.index)
        if self.info.future is None:
            zeros = [0] * len(keys)
            tier.policy.add_many(keys, zeros, zeros, self.info)
        else:
            for key in keys:
                self._add(tier, key)
        tier.stats.resident_peak = max(tier.stats.resident_peak, tier.resident)

    def _add(self, tier: LowerTier, key: int) -> None:
        info = self.info
        if info.future is not None:
            info.next_use = info.future(key, info.now_s)
        tier.policy.add(key, info)

    def _make_room(self, tier: LowerTier, count: int) -> None:
        evictable = len(tier.policy)
        victims = tier.policy.evict(min(count, evictable)) if evictable else []
        tier.resident -= len(victims)
        self.version += 1
        if tier.shared:
            consume(map(tier.where.__delitem__, victims))  # type: ignore[union-attr]
        else:
            self.where.remove(victims, tier.index)
        if not victims:
            return
        below = tier.index + 1
        if below < len(self.tiers):
            tier.stats.demoted_out += len(victims)
            self._write(below, victims)
        else:
            tier.stats.dropped += len(victims)

    def _remove(self, tier: LowerTier, key: int) -> None:
        tier.resident -= 1
        self.version += 1
        if tier.shared:
            del tier.where[key]  # type: ignore[union-attr]
        else:
            self.where.remove([key], tier.index)
        tier.policy.forget(key)

    # -- checks ----------------------------------------------------------------------------------
    def check(self) -> None:
        """Assert capacity, placement and conservation invariants (tests call this)."""
        landed = [0] * len(self.tiers)
        incoming = [0] * len(self.tiers)
        maps = [self.where.values()]
        if self.shared_where is not None:
            maps.append(iter(self.shared_where.values()))
        for values in maps:
            for t in values:
                if t >= 0:
                    landed[t] += 1
                else:
                    incoming[~t] += 1
        for tier in self.tiers:
            assert 0 <= tier.used <= tier.capacity_blocks, (tier.name, tier.used)
            assert (tier.resident, tier.incoming) == (landed[tier.index], incoming[tier.index])
            s = tier.stats
            assert s.written_in == (
                tier.resident
                + tier.incoming
                + s.demoted_out
                + s.dropped
                + s.removed_exclusive
                + s.superseded
            ), (tier.name, s, tier.resident, tier.incoming)
            assert all(k in tier.where for k in tier.pinned)  # type: ignore[operator]

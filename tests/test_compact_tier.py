"""The compact lower-tier state (kvsim.kvcache.compact_tier) against the dict and LRU structure
it replaces: identical victims, contents and lookups on random operation sequences, and keys
that are not dense ids through the dict edge."""

from __future__ import annotations

import numpy as np
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kvcache.block_pool import BlockPool
from kvsim.kvcache.compact_tier import (
    PAGE_IDS,
    Bits,
    CompactLRU,
    DensePlacement,
    DictPlacement,
)
from kvsim.kvcache.hierarchy import Hierarchy, LowerTier
from kvsim.kvcache.link import Link
from kvsim.policies.base import BlockInfo
from kvsim.policies.lru import LRU

INFO = BlockInfo()


def add(policy, keys: list[int]) -> None:
    zeros = [0] * len(keys)
    policy.add_many(keys, zeros, zeros, INFO)


def test_lru_order_by_hand():
    lru = CompactLRU()
    add(lru, [1, 2, 3])
    lru.discard(2)  # a load pins 2 ...
    add(lru, [2])  # ... and gives it back: now the most recent
    add(lru, [4])
    assert len(lru) == 4
    assert lru.order() == [1, 3, 2, 4]
    assert lru.evict(3) == [1, 3, 2]  # 2's first entry is stale and skipped
    assert len(lru) == 1 and lru.victim() == 4


def test_bits_small_and_large_batches():
    bits = Bits()
    small = [3, 9, 10, 700]
    large = list(range(1000, 1200, 3))  # a numpy pass, several keys per byte
    bits.add_many(small)
    bits.add_many(large)
    assert bits.count == len(small) + len(large)
    assert sorted(bits) == sorted(small + large)
    assert 9 in bits and 8 not in bits and -1 not in bits and 10**9 not in bits
    bits.remove_many(large[::2])
    bits.remove_many([9])
    assert sorted(bits) == sorted([3, 10, 700, *large[1::2]])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, 6 * PAGE_IDS), max_size=80)),
        max_size=30,
    )
)
def test_paged_bits_hold_what_a_set_holds(batches):
    """Adds and removes, in small (Python) and large (numpy) batches over several pages: the
    same members as a set, and pages emptied give their slots to the next pages filled."""
    bits, reference = Bits(), set()
    probe = np.arange(-3, 7 * PAGE_IDS)
    for adding, keys in batches:
        keys = list(dict.fromkeys(keys))
        if adding:
            keys = [k for k in keys if k not in reference]
            bits.add_many(keys)
            reference.update(keys)
        else:
            keys = [k for k in keys if k in reference]
            bits.remove_many(keys)
            reference.difference_update(keys)
        assert bits.count == len(reference)
        assert list(bits) == sorted(reference)
        assert bits.members(probe).tolist() == [int(k) in reference for k in probe]
        # `absent` in a Python pass (few keys) and a numpy one, and keys no int64 holds
        for keys in (probe.tolist()[::300], [*probe.tolist(), 1 << 70]):
            assert bits.absent(keys) == [k for k in keys if k not in reference]
        pages = {k // PAGE_IDS for k in reference}
        assert len(bits.buf) // (PAGE_IDS // 8) - len(bits.free) == len(pages)


class Model:
    """One tier's placement and LRU order, driven as the hierarchy drives them: writes start
    (incoming), land (evictable), loads pin and unpin or remove (exclusive), eviction."""

    def __init__(self, placement, policy) -> None:
        self.where = placement
        self.policy = policy
        self.pinned: set[int] = set()

    def write(self, keys: list[int]) -> list[int]:
        keys = self.where.not_held(list(dict.fromkeys(keys)))
        self.where.write(keys, 0)
        return keys

    def land(self, keys: list[int]) -> None:
        self.where.land(keys, 0)
        add(self.policy, keys)

    def pin(self, keys: list[int]) -> None:
        self.policy.discard_many(keys)
        self.pinned.update(keys)

    def unpin(self, keys: list[int], exclusive: bool) -> None:
        self.pinned.difference_update(keys)
        if exclusive:
            for key in keys:
                self.where.remove([key], 0)
                self.policy.forget(key)
        else:
            add(self.policy, keys)

    def evict(self, count: int) -> list[int]:
        victims = self.policy.evict(min(count, len(self.policy)))
        self.where.remove(victims, 0)
        return victims


@st.composite
def operations(draw):
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["write", "land", "pin", "unpin", "remove", "evict"]),
                st.lists(st.integers(0, 300), max_size=60),
                st.integers(0, 50),
            ),
            max_size=60,
        )
    )


@settings(max_examples=150, deadline=None)
@given(operations())
def test_compact_tier_equals_dict_and_lru(ops):
    compact = Model(DensePlacement(1), CompactLRU())
    reference = Model(DictPlacement(), LRU())
    in_flight: list[int] = []
    for op, keys, count in ops:
        if op == "write":
            written = compact.write(keys)
            assert written == reference.write(keys)
            in_flight += written
        elif op == "land":
            landing, in_flight = in_flight[:count], in_flight[count:]
            compact.land(landing)
            reference.land(landing)
        elif op == "pin":
            # blocks a load reads: landed and not already pinned
            held = [k for k in dict.fromkeys(keys) if reference.where.get(k) == 0]
            free = [k for k in held if k not in reference.pinned]
            compact.pin(free)
            reference.pin(free)
        elif op in ("unpin", "remove"):
            done = sorted(reference.pinned)[:count]
            compact.unpin(done, op == "remove")
            reference.unpin(done, op == "remove")
        else:
            assert compact.evict(count) == reference.evict(count)
        assert compact.where.as_dict() == reference.where.as_dict()
        assert len(compact.policy) == len(reference.policy)
        chain = keys + list(range(40))
        for start in (0, 5):
            assert compact.where.prefix(chain, start, len(chain)) == reference.where.prefix(
                chain, start, len(chain)
            )
    # what is left leaves in the same order
    assert compact.evict(10**6) == reference.evict(10**6)


def hierarchy(capacity: int) -> tuple[simpy.Environment, Hierarchy]:
    env = simpy.Environment()
    link = Link(env, "dram", 1e9, 1e9, 0.0)
    tier = LowerTier(name="dram", index=0, capacity_blocks=capacity, policy=LRU(), link=link)
    return env, Hierarchy(env, [tier], block_bytes=1000)


def written(env: simpy.Environment, h: Hierarchy, keys: list[int]) -> None:
    h.evicted_from_hbm(keys)
    env.run()
    h.check()


def test_keys_that_are_not_dense_ids_move_the_hierarchy_to_dicts():
    env, h = hierarchy(capacity=6)
    assert h.where.dense and isinstance(h.tiers[0].policy, CompactLRU)
    written(env, h, [10, 11, 12])
    big = [2**64 + 7, -5]  # a hand-made hash and a negative one: no bitset holds them
    written(env, h, big)
    assert not h.where.dense and type(h.tiers[0].policy) is LRU
    assert h.where.as_dict() == {10: 0, 11: 0, 12: 0, 2**64 + 7: 0, -5: 0}
    assert h.chain([10, 11, 12, 2**64 + 7, 99], 0, 5) == [0, 0, 0, 0]
    written(env, h, [20, 21, 22])  # full: the three oldest go, in LRU order
    assert h.tiers[0].stats.dropped == 2
    assert set(h.where.as_dict()) == {12, 2**64 + 7, -5, 20, 21, 22}


def test_compact_and_dict_hierarchies_agree():
    env_a, dense = hierarchy(capacity=50)
    env_b, dicts = hierarchy(capacity=50)
    dicts._to_dicts()
    assert dense.where.dense and not dicts.where.dense
    for round_ in range(6):
        keys = [round_ * 37 + i for i in range(40)]  # overlapping ranges: some already below
        for env, h in ((env_a, dense), (env_b, dicts)):
            written(env, h, keys)
        assert dense.where.as_dict() == dicts.where.as_dict()
        hashes = list(range(0, 300))
        for start in (0, 37, 100, 250):
            assert dense.chain(hashes, start, 300) == dicts.chain(hashes, start, 300)
    assert dense.tiers[0].stats == dicts.tiers[0].stats


@st.composite
def pool_requests(draw):
    """Requests against an HBM pool: a chain of block ids (prefixes shared among requests),
    released later in any order."""
    stems = draw(st.lists(st.lists(st.integers(1, 400), max_size=12), min_size=1, max_size=6))
    return (
        draw(
            st.lists(
                st.tuples(
                    st.integers(0, len(stems) - 1), st.lists(st.integers(1, 400), max_size=10)
                ),
                max_size=50,
            )
        ),
        stems,
        draw(st.integers(1, 3)),
    )


def _drive_pool(pool: BlockPool, requests, stems, lag: int) -> list[list[int]]:
    """Each request hits its cached prefix, allocates and registers the rest, and is released
    `lag` requests later (deepest-first); the pool's victims, as the engine's calls make them."""
    victims: list[list[int]] = []
    evict = pool.policy.evict

    def recording(count: int) -> list[int]:
        out = evict(count)
        victims.append(out)
        return out

    pool.policy.evict = recording  # type: ignore[method-assign]
    running: list[tuple[list[int], list[int]]] = []
    for now, (stem, tail) in enumerate(requests):
        chain = list(dict.fromkeys(stems[stem] + tail))
        hit, _ = pool.cached_prefix(chain, len(chain))
        pool.acquire(chain, hit, now)  # pinned before room is made, as the engine does
        if not pool.allocate(len(chain) - hit):
            pool.release(chain, list(range(hit)), 0, now)
            continue
        fresh = pool.register(chain, hit, len(chain), now)
        running.append((chain, list(range(hit)) + fresh))
        while len(running) > lag:
            done, positions = running.pop(0)
            pool.release(done, positions, len(done) - len(positions), now)
        pool.check()
    return victims


@settings(max_examples=150, deadline=None)
@given(pool_requests())
def test_compact_lru_in_the_hbm_pool_evicts_as_lru(case):
    requests, stems, lag = case
    compact, reference = BlockPool(24, CompactLRU()), BlockPool(24, LRU())
    assert _drive_pool(compact, requests, stems, lag) == _drive_pool(
        reference, requests, stems, lag
    )
    assert compact.refs == reference.refs


def test_a_key_that_is_no_int32_brings_lru_back_to_the_pool():
    pool = BlockPool(4, CompactLRU())
    pool.allocate(2)
    pool.release([5, 6], pool.register([5, 6], 0, 2, 0.0), 0, 0.0)  # evictable: 6, then 5
    assert isinstance(pool.policy, CompactLRU)
    pool.allocate(1)
    pool.release([2**40], pool.register([2**40], 0, 1, 1.0), 0, 1.0)  # a hand-made hash
    assert type(pool.policy) is LRU and len(pool.policy) == 3
    evicted = pool.policy.evict(3)
    assert evicted == [6, 5, 2**40]  # the order CompactLRU kept, then the new key

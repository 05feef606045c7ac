"""Block hash chains: the definition, the prefix property, and the vectorised paths."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.traces.blocks import (
    CHAIN_SEED,
    _mix_int,
    batch_block_hashes,
    batch_sequence_block_hashes,
    block_hashes,
    block_kinds,
    first_seen_ids,
    mix,
    sequence_block_hashes,
    sequence_block_ids,
)
from kvsim.traces.stats import reused_from_ids

U64 = st.integers(min_value=1, max_value=2**64 - 1)
SEGMENT = st.tuples(U64, st.integers(min_value=1, max_value=300))
SEGMENTS = st.lists(SEGMENT, max_size=8)


def arrays(segments: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    hashes = np.array([h for h, _ in segments], dtype=np.uint64)
    tokens = np.array([n for _, n in segments], dtype=np.int64)
    return hashes, tokens


def reference_block_hashes(segments: list[tuple[int, int]], block_size: int) -> list[int]:
    """The definition, token by token in plain Python ints: slow but obviously right."""
    chain, start, out = CHAIN_SEED, 0, []
    for h, n in segments:
        for e in range(start + 1, start + n + 1):
            if e % block_size == 0:
                out.append(_mix_int(chain, h, e - start))
        chain = _mix_int(chain, h, n)
        start += n
    return out


@settings(max_examples=200, deadline=None)
@given(SEGMENTS, st.integers(min_value=1, max_value=64))
def test_matches_reference_definition(segments, block_size):
    got = block_hashes(*arrays(segments), block_size)
    assert got.dtype == np.uint64
    assert got.tolist() == reference_block_hashes(segments, block_size)


@settings(max_examples=200, deadline=None)
@given(SEGMENTS, SEGMENTS, SEGMENTS, U64, U64, st.integers(min_value=1, max_value=64))
def test_prefix_property(shared, tail_a, tail_b, first_a, first_b, block_size):
    """Two prompts share exactly the blocks that end inside their shared segments."""
    if first_a == first_b:
        first_b ^= 1
    a = [*shared, (first_a, 7), *tail_a]
    b = [*shared, (first_b, 7), *tail_b]
    ha = block_hashes(*arrays(a), block_size)
    hb = block_hashes(*arrays(b), block_size)
    shared_tokens = sum(n for _, n in shared)
    inside = shared_tokens // block_size
    assert ha[:inside].tolist() == hb[:inside].tolist()
    # Every later block of one prompt is absent from the other (distinct prefixes, distinct hashes).
    assert not set(ha[inside:].tolist()) & set(hb.tolist())


@settings(max_examples=100, deadline=None)
@given(SEGMENTS, st.integers(min_value=1, max_value=32), st.integers(min_value=2, max_value=5))
def test_content_independent_of_block_size(segments, block_size, factor):
    """A block ending at token e has one hash whatever the block size."""
    hashes, tokens = arrays(segments)
    small = block_hashes(hashes, tokens, block_size)
    large = block_hashes(hashes, tokens, block_size * factor)
    assert large.tolist() == small[factor - 1 :: factor].tolist()


@settings(max_examples=100, deadline=None)
@given(SEGMENTS, st.integers(min_value=1, max_value=100))
def test_count_and_nonzero(segments, block_size):
    hashes, tokens = arrays(segments)
    got = block_hashes(hashes, tokens, block_size)
    assert got.size == int(tokens.sum()) // block_size
    assert (got != 0).all()


def test_block_at_segment_end_is_chain_value():
    # A prompt [A] whose length is a multiple of the block size ends on S_1 = mix(seed, A, n).
    got = block_hashes(np.array([42], np.uint64), np.array([32]), 16)
    assert int(got[-1]) == _mix_int(CHAIN_SEED, 42, 32)


def test_deterministic_and_pinned():
    """Pinned values: a change to mix() would silently change every stored cache key."""
    hashes = np.array([1, 2**64 - 1, 12345], dtype=np.uint64)
    tokens = np.array([10, 20, 5], dtype=np.int64)
    first = block_hashes(hashes, tokens, 8)
    assert first.tolist() == block_hashes(hashes.copy(), tokens.copy(), 8).tolist()
    assert first.tolist() == reference_block_hashes([(1, 10), (2**64 - 1, 20), (12345, 5)], 8)
    assert [hex(h) for h in first.tolist()] == [
        "0x417bc847d61d8043",
        "0xce668d6e9a42fcd",
        "0x454fab91f4ebe543",
        "0xfbedb53c23d86583",
    ]
    assert int(mix(np.uint64(1), np.uint64(2), np.uint64(3))[0]) == _mix_int(1, 2, 3)
    assert _mix_int(1, 2, 3) != _mix_int(2, 1, 3)


def test_empty_and_short_prompts():
    assert block_hashes(np.array([], np.uint64), np.array([], np.int64), 16).size == 0
    assert block_hashes(np.array([5], np.uint64), np.array([15]), 16).size == 0
    with pytest.raises(ValueError):
        block_hashes(np.array([5], np.uint64), np.array([0]), 16)
    with pytest.raises(ValueError):
        block_hashes(np.array([5], np.uint64), np.array([16]), 0)


def test_no_overflow_warnings():
    rng = np.random.default_rng(1)
    hashes = rng.integers(1, 2**64 - 1, 50, dtype=np.uint64, endpoint=True)
    tokens = rng.integers(1, 700, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        block_hashes(hashes, tokens, 16)
        mix(hashes, hashes, tokens.astype(np.uint64))
        batch_block_hashes(np.array([0, 20, 50]), hashes, tokens, 16)


def test_block_kinds_is_kind_of_last_token():
    kinds = block_kinds(np.array([0, 1, 2], np.uint8), np.array([10, 6, 20]), 8)
    # Block ends 8, 16, 24, 32 fall in segments 0, 1, 2, 2.
    assert kinds.tolist() == [0, 1, 2, 2]


def test_sequence_hashes_are_next_turn_prefix():
    """The cached prompt+reply blocks are exactly the next turn's leading blocks."""
    prompt_h, prompt_n = np.array([11, 22], np.uint64), np.array([100, 37])
    reply_h, reply_n = 99, 250
    cached = sequence_block_hashes(prompt_h, prompt_n, reply_h, reply_n, 16)
    assert cached.size == (137 + 250) // 16
    next_turn = block_hashes(np.array([11, 22, reply_h, 33], np.uint64), [100, 37, 250, 40], 16)
    assert next_turn[: cached.size].tolist() == cached.tolist()
    # A reply that is not content-addressed adds nothing that can be found again.
    plain = sequence_block_hashes(prompt_h, prompt_n, 0, reply_n, 16)
    assert plain.tolist() == block_hashes(prompt_h, prompt_n, 16).tolist()


@settings(max_examples=50, deadline=None)
@given(st.lists(SEGMENTS, min_size=1, max_size=6), st.integers(min_value=1, max_value=40))
def test_batch_equals_per_row(rows, block_size):
    offsets = np.cumsum([0] + [len(r) for r in rows])
    hashes, tokens = arrays([s for r in rows for s in r])
    block_offsets, got = batch_block_hashes(offsets, hashes, tokens, block_size)
    for i, row in enumerate(rows):
        expect = block_hashes(*arrays(row), block_size).tolist()
        assert got[block_offsets[i] : block_offsets[i + 1]].tolist() == expect


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(SEGMENTS, U64 | st.just(0), st.integers(min_value=0, max_value=90)),
             min_size=1, max_size=6),
    st.integers(min_value=1, max_value=40),
)  # fmt: skip
def test_batch_sequence_equals_per_row(rows, block_size):
    offsets = np.cumsum([0] + [len(segs) for segs, _, _ in rows])
    hashes, tokens = arrays([s for segs, _, _ in rows for s in segs])
    out_hash = np.array([h for _, h, _ in rows], dtype=np.uint64)
    out_tokens = np.array([n for _, _, n in rows], dtype=np.int64)
    block_offsets, got = batch_sequence_block_hashes(
        offsets, hashes, tokens, out_hash, out_tokens, block_size
    )
    for i, (segs, h, n) in enumerate(rows):
        expect = sequence_block_hashes(*arrays(segs), h, n, block_size).tolist()
        assert got[block_offsets[i] : block_offsets[i + 1]].tolist() == expect


# few hashes and lengths, so prompts often share prefixes, and a prefix recurs with a segment
# of another length after it (a longer reply, a cut prompt)
SMALL_SEGMENT = st.tuples(
    st.integers(min_value=1, max_value=3), st.integers(min_value=1, max_value=40)
)
SHARING_ROWS = st.lists(
    st.tuples(st.lists(SMALL_SEGMENT, max_size=6), st.sampled_from([0, 1, 2]),
              st.integers(min_value=0, max_value=50)),
    min_size=1, max_size=12,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(SHARING_ROWS, st.integers(min_value=1, max_value=24), st.booleans())
def test_block_ids_number_the_hashes_by_first_appearance(rows, block_size, small_chunks):
    """Numbering segments by prefix, then blocks by ordinal, gives the ids of hashing every
    block and numbering the hashes; also when both passes work a few rows or blocks at a time."""
    offsets = np.cumsum([0] + [len(segs) for segs, _, _ in rows])
    hashes, tokens = arrays([s for segs, _, _ in rows for s in segs])
    out_hash = np.array([h for _, h, _ in rows], dtype=np.uint64)
    out_tokens = np.array([n for _, _, n in rows], dtype=np.int64)
    args = (offsets, hashes, tokens, out_hash, out_tokens, block_size)
    expect_offsets, expect = batch_sequence_block_hashes(*args)
    with pytest.MonkeyPatch.context() as patch:
        if small_chunks:
            patch.setattr("kvsim.traces.blocks.HASH_ROWS", 3)
            patch.setattr("kvsim.traces.blocks.ID_BLOCKS", 5)
        got_offsets, got = sequence_block_ids(*args)
    assert got_offsets.tolist() == expect_offsets.tolist()
    assert got.tolist() == first_seen_ids(expect).tolist()


def test_block_ids_of_a_prefix_seen_shorter_before():
    """A prompt cut inside its last segment, then the same prompt whole: the whole one's extra
    blocks are new, its first ones are the cut prompt's."""
    h = np.array([7, 8], dtype=np.uint64)
    offsets, ids = sequence_block_ids(
        np.array([0, 2, 4, 5]), np.append(np.append(h, h), np.uint64(9)),
        np.array([16, 20, 16, 64, 16]), np.zeros(3, np.uint64), np.zeros(3), 16,
    )  # fmt: skip
    assert offsets.tolist() == [0, 2, 7, 8]
    assert ids.tolist() == [1, 2, 1, 2, 3, 4, 5, 6]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=12), max_size=60))
def test_first_seen_ids_number_by_first_appearance(values):
    # an odd multiplier keeps distinct values distinct and spreads them over all 64 bits
    hashes = np.array(values, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    ids = first_seen_ids(hashes)
    expect: dict[int, int] = {}
    for v in values:
        expect.setdefault(v, len(expect) + 1)  # 1, 2, ... in order of first appearance
    assert ids.tolist() == [expect[v] for v in values]
    assert int(ids.max(initial=0)) == len(expect)


def test_first_seen_ids_make_a_new_chain_consecutive():
    """Two prompts sharing a prefix: the second's new blocks follow on from the first's ids."""
    shared = np.array([11, 22, 33], dtype=np.uint64)
    first = np.concatenate([shared, np.array([44, 55], dtype=np.uint64)])
    second = np.concatenate([shared, np.array([66, 77, 88], dtype=np.uint64)])
    ids = first_seen_ids(np.concatenate([first, second]))
    assert ids.tolist() == [1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.integers(min_value=1, max_value=15), max_size=10), min_size=1,
             max_size=8),
    st.integers(min_value=0, max_value=12),
    st.sampled_from([1, 3, 1 << 22]),
)  # fmt: skip
def test_reused_from_ids_counts_blocks_seen_earlier(rows, cap, chunk):
    """Against a set: a block hits when any earlier position (any row) held its hash."""
    offsets = np.cumsum([0] + [len(r) for r in rows])
    flat = np.array([h for r in rows for h in r], dtype=np.uint64)
    ids = first_seen_ids(flat)
    caps = np.full(len(rows), cap, dtype=np.int64)
    seen: set[int] = set()
    expect = []
    for r in rows:
        hits = 0
        for k, h in enumerate(r):
            hits += h in seen and k < cap
            seen.add(h)
        expect.append(hits)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("kvsim.traces.stats.REUSE_BLOCKS", chunk)  # rows a few blocks at a time
        assert reused_from_ids(offsets, ids, caps).tolist() == expect


def test_speed_report():
    """A 128k-token prompt of 64 segments at block size 16: reports the time, asserts none."""
    rng = np.random.default_rng(0)
    hashes = rng.integers(1, 2**63, 64, dtype=np.uint64)
    tokens = np.full(64, 2048)
    t0 = time.perf_counter()
    got = block_hashes(hashes, tokens, 16)
    elapsed_ms = (time.perf_counter() - t0) * 1e3
    assert got.size == 64 * 2048 // 16
    print(f"block_hashes: {got.size} blocks in {elapsed_ms:.2f} ms")

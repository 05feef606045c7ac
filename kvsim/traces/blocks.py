"""Block hash chains derived from a prompt's segments, at any block size.

A trace stores each prompt as content-addressed segments ``(hash, tokens, kind)``; the KV cache
works in fixed-size blocks. This module turns one into the other, so one trace serves every block
size.

Definition. A running segment-chain value starts at ``CHAIN_SEED`` and absorbs one segment at a
time: ``S[j+1] = mix(S[j], h[j], n[j])``. A full block ending at token ``e`` (exclusive) lies in the
segment ``j`` with ``start[j] < e <= start[j] + n[j]`` and hashes to
``mix(S[j], h[j], e - start[j])``. So a block hash names the whole prefix up to the block's end:
two prompts share a block hash exactly when they share the segments up to that point, and a block
ending on a segment boundary hashes to ``S[j+1]``. Hash 0 is never produced; it is reserved for
"none".

``mix`` is built from the splitmix64 finaliser with wrap-around uint64 arithmetic. The chain over
segments is sequential (a short Python loop on ints); the per-block work is vectorised with numpy.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

__all__ = [
    "CHAIN_SEED",
    "batch_block_hashes",
    "batch_sequence_block_hashes",
    "block_hashes",
    "block_kinds",
    "first_seen_ids",
    "mix",
    "sequence_block_hashes",
    "sequence_block_ids",
    "table_block_ids",
]

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
#: Replaces a mix result of 0, which is reserved for "no hash".
_ZERO_SUBSTITUTE = 0x5851F42D4C957F2D
#: Chain value before the first segment ("kvsim" in ASCII, then a version byte).
CHAIN_SEED = 0x6B7673696D000001

_U_GAMMA = np.uint64(_GAMMA)
_U_M1 = np.uint64(_M1)
_U_M2 = np.uint64(_M2)
_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _fmix_int(z: int) -> int:
    """splitmix64 step on a Python int (bit-identical to `_fmix_arr`)."""
    z = (z + _GAMMA) & _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _fmix_arr(z: np.ndarray) -> np.ndarray:
    """splitmix64 step on a uint64 array; array (not scalar) arithmetic wraps without warnings."""
    z = z + _U_GAMMA
    z = (z ^ (z >> _U30)) * _U_M1
    z = (z ^ (z >> _U27)) * _U_M2
    return z ^ (z >> _U31)


def _mix_pre_int(a: int, b: int) -> int:
    """The part of mix(a, b, c) that does not depend on c, so it is computed once per segment."""
    return _fmix_int(_fmix_int(a) ^ b)


def _mix_int(a: int, b: int, c: int) -> int:
    out = _fmix_int(_mix_pre_int(a, b) ^ c)
    return out or _ZERO_SUBSTITUTE


def _mix_post_arr(pre: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = _fmix_arr(pre ^ c.astype(np.uint64))
    out[out == 0] = np.uint64(_ZERO_SUBSTITUTE)
    return out


def mix(a: npt.ArrayLike, b: npt.ArrayLike, c: npt.ArrayLike) -> np.ndarray:
    """Mix chain value `a`, content hash `b` and token count `c` (uint64 arrays, broadcast).

    Order matters (mix(a, b, c) != mix(b, a, c)) and the result is never 0.
    """
    a = np.atleast_1d(np.asarray(a, dtype=np.uint64))
    b = np.atleast_1d(np.asarray(b, dtype=np.uint64))
    c = np.atleast_1d(np.asarray(c, dtype=np.uint64))
    return _mix_post_arr(_fmix_arr(_fmix_arr(a) ^ b), c)


def _as_segments(seg_hashes: np.ndarray, seg_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hashes = np.asarray(seg_hashes, dtype=np.uint64).ravel()
    tokens = np.asarray(seg_tokens, dtype=np.int64).ravel()
    if hashes.shape != tokens.shape:
        raise ValueError(f"{hashes.size} segment hashes but {tokens.size} token counts")
    if tokens.size and tokens.min() < 1:
        raise ValueError("every segment must hold at least one token")
    return hashes, tokens


def _segment_prefix(hashes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Per segment j, the c-independent part of mix(S[j], h[j], ·), walking the chain."""
    pre = np.empty(hashes.size, dtype=np.uint64)
    s = CHAIN_SEED
    for j, (h, n) in enumerate(zip(hashes.tolist(), tokens.tolist(), strict=True)):
        p = _mix_pre_int(s, h)
        pre[j] = p
        s = _fmix_int(p ^ n) or _ZERO_SUBSTITUTE
    return pre


def _block_segment(tokens: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """For each full block: the segment holding its last token, and tokens of it up to the end."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    ends = np.cumsum(tokens)
    total = int(ends[-1]) if ends.size else 0
    block_ends = np.arange(1, total // block_size + 1, dtype=np.int64) * block_size
    seg = np.searchsorted(ends, block_ends, side="left")
    within = block_ends - (ends[seg] - tokens[seg])
    return seg, within


def block_hashes(seg_hashes: np.ndarray, seg_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Hash of every full block of a prompt (uint64, `total // block_size` of them, none is 0)."""
    hashes, tokens = _as_segments(seg_hashes, seg_tokens)
    seg, within = _block_segment(tokens, block_size)
    if seg.size == 0:
        return np.empty(0, dtype=np.uint64)
    pre = _segment_prefix(hashes, tokens)
    return _mix_post_arr(pre[seg], within)


def block_kinds(seg_kinds: np.ndarray, seg_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Kind code (index into SEGMENT_KINDS) of the last token of every full block."""
    kinds = np.asarray(seg_kinds, dtype=np.uint8).ravel()
    tokens = np.asarray(seg_tokens, dtype=np.int64).ravel()
    if kinds.shape != tokens.shape:
        raise ValueError(f"{kinds.size} segment kinds but {tokens.size} token counts")
    seg, _ = _block_segment(tokens, block_size)
    return kinds[seg]


def sequence_block_hashes(
    seg_hashes: np.ndarray,
    seg_tokens: np.ndarray,
    output_hash: int,
    output_tokens: int,
    block_size: int,
) -> np.ndarray:
    """Full-block hashes of prompt + reply, as cached once the request finishes.

    The reply is appended as one more segment when `output_hash` != 0, so the next turn of a chat,
    whose prompt carries that segment, hits these blocks. A reply that is not content-addressed
    (`output_hash` == 0) cannot be found again, so only the prompt's blocks are returned.
    """
    hashes, tokens = _as_segments(seg_hashes, seg_tokens)
    if output_hash != 0 and output_tokens > 0:
        hashes = np.append(hashes, np.uint64(output_hash))
        tokens = np.append(tokens, np.int64(output_tokens))
    return block_hashes(hashes, tokens, block_size)


def batch_block_hashes(
    offsets: np.ndarray, seg_hashes: np.ndarray, seg_tokens: np.ndarray, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Block hashes of many prompts at once (e.g. a whole trace), equal to `block_hashes` per row.

    `offsets` (length rows + 1) delimits each row's segments in the flat arrays. Returns
    `(block_offsets, hashes)` in the same layout. The chain walks segment positions, vectorised
    over rows, so the Python loop runs max-segments-per-row times, not once per segment.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    hashes, tokens = _as_segments(seg_hashes, seg_tokens)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    rows = offsets.size - 1
    pre = _segment_prefixes(offsets, hashes, tokens)
    # Per row, block ends in global token coordinates; find each block's segment in one search.
    ends = np.cumsum(tokens)
    row_start_tok = np.concatenate(([0], ends))[offsets[:-1]]
    row_total = np.concatenate(([0], ends))[offsets[1:]] - row_start_tok
    nblocks = row_total // block_size
    block_offsets = np.concatenate(([0], np.cumsum(nblocks))).astype(np.int64)
    row_of_block = np.repeat(np.arange(rows, dtype=np.int64), nblocks)
    k_in_row = np.arange(block_offsets[-1], dtype=np.int64) - block_offsets[row_of_block]
    block_ends = row_start_tok[row_of_block] + (k_in_row + 1) * block_size
    seg = np.searchsorted(ends, block_ends, side="left")
    within = block_ends - (ends[seg] - tokens[seg])
    return block_offsets, _mix_post_arr(pre[seg], within)


#: requests hashed at once by `batch_sequence_block_hashes`: its temporaries are about 60
#: bytes a block, so a window of millions of requests is hashed a slice at a time
HASH_ROWS = 65_536


def batch_sequence_block_hashes(
    offsets: np.ndarray,
    seg_hashes: np.ndarray,
    seg_tokens: np.ndarray,
    output_hash: np.ndarray,
    output_tokens: np.ndarray,
    block_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`sequence_block_hashes` of many requests at once (prompt, then the reply as one more
    segment where it is content-addressed), in `batch_block_hashes`' layout; `HASH_ROWS`
    requests at a time into one array (a request's chain depends on it alone)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    output_hash, output_tokens = np.asarray(output_hash), np.asarray(output_tokens)
    n = offsets.size - 1
    running = np.concatenate(([0], np.cumsum(seg_tokens, dtype=np.int64)))
    total = running[offsets[1:]] - running[offsets[:-1]]
    total += np.where((output_hash != 0) & (output_tokens > 0), output_tokens, 0)
    block_offsets = np.concatenate(([0], np.cumsum(total // block_size))).astype(np.int64)
    hashes = np.empty(int(block_offsets[-1]), np.uint64)
    for a in range(0, n, HASH_ROWS):
        b = min(a + HASH_ROWS, n)
        lo, hi = offsets[a], offsets[b]
        _, part = _sequence_block_hashes(
            offsets[a : b + 1] - lo,
            seg_hashes[lo:hi],
            seg_tokens[lo:hi],
            output_hash[a:b],
            output_tokens[a:b],
            block_size,
        )
        hashes[block_offsets[a] : block_offsets[b]] = part
    return block_offsets, hashes


def _sequence_block_hashes(
    offsets: np.ndarray,
    seg_hashes: np.ndarray,
    seg_tokens: np.ndarray,
    output_hash: np.ndarray,
    output_tokens: np.ndarray,
    block_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    rows, hashes, tokens = _with_replies(
        offsets, seg_hashes, seg_tokens, output_hash, output_tokens
    )
    return batch_block_hashes(rows, hashes, tokens, block_size)


def _with_replies(
    offsets: np.ndarray,
    seg_hashes: np.ndarray,
    seg_tokens: np.ndarray,
    output_hash: np.ndarray,
    output_tokens: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's segments with its content-addressed reply as one more: (offsets, hashes,
    tokens) of the sequences that get cached."""
    counts = np.diff(offsets)
    reply = (output_hash != 0) & (output_tokens > 0)
    rows = np.concatenate(([0], np.cumsum(counts + reply))).astype(np.int64)
    hashes = np.empty(rows[-1], np.uint64)
    tokens = np.empty(rows[-1], np.int64)
    own = np.repeat(np.arange(counts.size), counts)
    at = rows[own] + (np.arange(own.size) - offsets[own])
    hashes[at], tokens[at] = seg_hashes, seg_tokens
    last = rows[1:][reply] - 1
    hashes[last] = output_hash[reply].astype(np.uint64)
    tokens[last] = output_tokens[reply]
    return rows, hashes, tokens


def _segment_prefixes(offsets: np.ndarray, hashes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Per segment, the part of its blocks' hashes that does not depend on where in the
    segment a block ends (`batch_block_hashes`' chain walk, without the blocks)."""
    rows = offsets.size - 1
    counts = np.diff(offsets)
    pre = np.empty(hashes.size, dtype=np.uint64)
    chain = np.full(rows, CHAIN_SEED, dtype=np.uint64)
    for k in range(int(counts.max()) if rows else 0):
        live = np.flatnonzero(counts > k)
        idx = offsets[live] + k
        p = _fmix_arr(_fmix_arr(chain[live]) ^ hashes[idx])
        pre[idx] = p
        chain[live] = _mix_post_arr(p, tokens[idx])
    return pre


def row_chunks(offsets: np.ndarray, blocks: int) -> list[tuple[int, int]]:
    """Consecutive row ranges [a, b) of about `blocks` blocks each (a row is never split), for
    passes whose temporaries grow with the blocks they hold; `offsets` delimits the rows."""
    n = offsets.size - 1
    cuts = np.searchsorted(offsets, np.arange(0, int(offsets[-1]), blocks), "right") - 1
    bounds = np.unique(np.concatenate((cuts, [n]))).tolist()
    return list(pairwise(bounds))


def _blocks_seen_before(code: np.ndarray, blocks: np.ndarray, span: int) -> np.ndarray:
    """Per segment, the most blocks an earlier segment of its prefix (`code`, numbered by first
    appearance) held: 0 for a prefix's first segment. Nearly every later segment holds no more
    than the first did, and then only the first matters; the running maximum is taken, by a
    stable sort, only over the prefixes where one held more (a prompt cut, then whole)."""
    cmax = np.maximum.accumulate(code)
    first = np.ones(code.size, dtype=bool)
    first[1:] = code[1:] > cmax[:-1]
    del cmax
    seen = blocks[first][code]
    seen[first] = 0
    grew = np.flatnonzero(~first & (blocks > seen))
    if grew.size:
        rows = np.flatnonzero(np.isin(code, np.unique(code[grew])))
        order = rows[np.argsort(code[rows], kind="stable")]
        grouped = code[order]
        running = np.maximum.accumulate(blocks[order] + grouped * span) - grouped * span
        later = np.flatnonzero(grouped[1:] == grouped[:-1]) + 1
        seen[order[later]] = running[later - 1]
    return seen


#: blocks numbered at once by `sequence_block_ids`' last pass (about 40 bytes of temporaries each)
ID_BLOCKS = 1 << 20


def sequence_block_ids(
    offsets: np.ndarray,
    seg_hashes: np.ndarray,
    seg_tokens: np.ndarray,
    output_hash: np.ndarray,
    output_tokens: np.ndarray,
    block_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`first_seen_ids` of `batch_sequence_block_hashes`, without hashing every block:
    (block offsets, ids), ids int32 where they fit.

    A block's hash is mix(prefix of its segment, tokens of the segment up to the block's end),
    and the prefix names everything before the segment, its start included. So two blocks are
    equal exactly when their segments have the same prefix and they are the same block of it
    (a 64-bit collision aside, which would merge hashes too). Segments are numbered by prefix;
    the first segment of a prefix to reach block k numbers it, at its place in trace order.
    Each block then costs a lookup, not a hash and a hash-table probe: the whole Mooncake
    conversation trace (9.0 M blocks, 0.3 M segments) is numbered in a fraction of the time."""
    offsets = np.asarray(offsets, dtype=np.int64)
    output_hash, output_tokens = np.asarray(output_hash), np.asarray(output_tokens)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = offsets.size - 1
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for a in range(0, max(n, 1), HASH_ROWS):
        b = min(a + HASH_ROWS, n)
        lo, hi = offsets[a], offsets[b]
        rows, hashes, tokens = _with_replies(
            offsets[a : b + 1] - lo,
            *_as_segments(seg_hashes[lo:hi], seg_tokens[lo:hi]),
            output_hash[a:b],
            output_tokens[a:b],
        )
        ends = np.concatenate(([0], np.cumsum(tokens)))
        starts = ends[:-1] - np.repeat(ends[rows[:-1]], np.diff(rows))  # within the request
        # full blocks ending inside each segment
        blocks = (starts + tokens) // block_size - starts // block_size
        in_blocks = np.concatenate(([0], np.cumsum(blocks)))
        parts.append(
            (
                _segment_prefixes(rows, hashes, tokens),
                blocks,
                in_blocks[rows[1:]] - in_blocks[rows[:-1]],
            )
        )
    pre = np.concatenate([p[0] for p in parts])
    blocks = np.concatenate([p[1] for p in parts])
    block_offsets = np.concatenate(([0], np.cumsum(np.concatenate([p[2] for p in parts]))))
    del parts
    code, _ = pd.factorize(pre)  # prefixes numbered by first appearance
    del pre
    span = int(blocks.max(initial=0)) + 1
    seen = _blocks_seen_before(code, blocks, span)
    new = np.maximum(blocks - seen, 0)
    base = np.concatenate(([1], 1 + np.cumsum(new)))[:-1]  # the id of a segment's first new block
    total = int(new.sum())
    intro = np.flatnonzero(new)
    keys = code[intro] * span + seen[intro]
    by_key = np.argsort(keys)
    keys, intro = keys[by_key], intro[by_key]
    shift = base[intro] - seen[intro]  # id = shift + ordinal, over the blocks a segment numbers
    narrow = np.int32 if total + 1 < np.iinfo(np.int32).max else np.int64
    ids = np.empty(int(block_offsets[-1]), dtype=narrow)
    seg_start = np.concatenate(([0], np.cumsum(blocks)))
    for a, b in row_chunks(seg_start, ID_BLOCKS):  # segments of about ID_BLOCKS blocks
        lo, hi = seg_start[a], seg_start[b]
        counts = blocks[a:b]
        ordinal = np.arange(hi - lo, dtype=np.int64) - np.repeat(seg_start[a:b] - lo, counts)
        at = np.searchsorted(keys, np.repeat(code[a:b] * span, counts) + ordinal, "right") - 1
        ids[lo:hi] = shift[at] + ordinal
    return block_offsets.astype(np.int64), ids


def _table_sequences(table: pa.Table) -> tuple[np.ndarray, ...]:
    """A canonical trace table's segment and reply columns, as the batch functions take them."""
    from kvsim.traces.schema import segment_columns

    seg = segment_columns(table)
    replies = (table.column(name).to_numpy() for name in ("output_hash", "output_tokens"))
    return (seg.offsets, seg.hashes, seg.tokens, *replies)


def table_block_hashes(table: pa.Table, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`batch_sequence_block_hashes` of every request of a canonical trace table."""
    return batch_sequence_block_hashes(*_table_sequences(table), block_size)


def table_block_ids(table: pa.Table, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`sequence_block_ids` of every request of a canonical trace table."""
    return sequence_block_ids(*_table_sequences(table), block_size)


def first_seen_ids(hashes: np.ndarray) -> np.ndarray:
    """Dense ids 1, 2, ... for `hashes`, numbered by first appearance (equal hashes share one
    id; the largest id is the number of distinct hashes).

    The engine keys its block tables by these instead of the 64-bit hashes. A dict's slot is its
    key's low bits, so a prompt's new blocks, first seen together, get consecutive ids and land in
    neighbouring slots: a chain's lookups touch a few cache lines instead of one per block, which
    at the table sizes of a large run is most of a block operation's cost
    (benchmarks/dict_lookup_latency.py). 0 is never an id (it names "no parent").
    `sequence_block_ids` gives the same ids from a trace's segments without hashing every
    block; this is the definition its tests hold it to."""
    codes, _ = pd.factorize(hashes)
    codes += 1  # in place: a long trace's codes are 8 bytes a block
    return codes

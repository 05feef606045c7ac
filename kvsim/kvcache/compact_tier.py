"""Compact state of a replica's node-local tiers below HBM: placement as bitsets, LRU order as a
queue of 4-byte ids, instead of per-block Python objects.

Why: a fleet's DRAM holds millions of blocks, and as dict entries and LRU queue entries each one
cost about 130 bytes of Python (README, Reliability notes: 1.42 M DRAM blocks added 182 MiB to a
100,000-request, 64-replica run). The engine's block ids are dense ints numbered by first
appearance (kvsim.engine.trace_view), so a tier can keep a bit per id for "landed here" and a
queue of int32 ids for its LRU order: 4 to 8 bytes per resident block, plus the bitset's pages
(`Bits`: only pages with members are kept, since a replica of a large fleet holds a thin,
scattered share of the trace's ids).

- `DensePlacement`: which node-local tier holds each block (a paged bitset per tier) and which
  blocks are being written (a small dict: writes in flight). Keys must be ints in [0, DENSE_LIMIT).
- `DictPlacement`: the same interface over one dict (any int keys): the edge mapping a hierarchy
  falls back to when a key is not a dense id (hand-made hashes in tests, shared pools' keys).
- `CompactLRU`: least-recently-used order of one tier's evictable blocks, a FIFO of ids with
  lazy deletion, victims identical to kvsim.policies.lru.LRU under the hierarchy's calls and
  the HBM block pool's (kvsim.kvcache.block_pool), which use it in LRU's place.

Placement codes are those of kvsim.kvcache.hierarchy: t (the copy is in tier t) or ~t (it is being
written into tier t); absent blocks have none.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, filterfalse, islice, repeat, takewhile

import numpy as np

from kvsim.policies.base import BlockInfo, EvictionPolicy
from kvsim.policies.lru import LRU

DENSE_LIMIT = 1 << 31  # ids fit an int32 queue entry; a larger key moves a hierarchy to dicts
_BATCH = 32  # below this many keys a Python loop beats a numpy pass's fixed cost
_BIT = tuple(1 << i for i in range(8))


def consume(iterator: Iterable[object]) -> None:
    """Run an iterator of side effects at C speed."""
    deque(iterator, maxlen=0)


def dense(keys: list[int]) -> bool:
    """Whether every key is a dense block id a bitset can hold."""
    return not keys or (min(keys) >= 0 and max(keys) < DENSE_LIMIT)


#: ids per page of a `Bits` (a power of two): small enough that a replica's scattered blocks
#: leave few pages nearly empty, large enough that the page table stays small
PAGE_IDS = 1 << 9
_SHIFT = PAGE_IDS.bit_length() - 1
_MASK = PAGE_IDS - 1
_PAGE_BYTES = PAGE_IDS // 8
_EMPTY_PAGE = bytes(_PAGE_BYTES)


class Bits:
    """A set of non-negative ints as a paged bitset: a table from page (id // PAGE_IDS) to a
    slot of `buf`, PAGE_IDS bits each, held only while the page has members.

    Why paged: a replica's tier holds a thin, scattered share of a fleet's ids (a day window:
    about 119 k of 77 M ids, 0.15 %), so one flat bitset per replica cost 9.6 MB of mostly zero
    bytes, 2.5 GiB over 256 replicas. Small batches are set and tested in Python, large ones
    through numpy views (created per call, so the buffers can grow between calls)."""

    __slots__ = ("buf", "count", "free", "table")

    def __init__(self) -> None:
        self.table = array("i")  # page -> slot, -1 for a page with no members
        self.buf = bytearray()  # slot s holds bits [s * PAGE_IDS, (s + 1) * PAGE_IDS)
        self.free: list[int] = []  # slots of pages emptied since
        self.count = 0  # members

    def __contains__(self, key: int) -> bool:
        page = key >> _SHIFT
        if not 0 <= page < len(self.table):
            return False
        slot = self.table[page]
        if slot < 0:
            return False
        bit = (slot << _SHIFT) | (key & _MASK)
        return bool(self.buf[bit >> 3] & _BIT[bit & 7])

    def absent(self, keys: list[int]) -> list[int]:
        """The keys that are not members (any ints), in their order."""
        if len(keys) >= _BATCH:
            ids = _as_ids(keys)
            if ids is not None:
                return list(compress(keys, (~self.members(ids)).tolist()))
        table, buf, pages = self.table, self.buf, len(self.table)
        out = []
        for k in keys:  # `__contains__` inlined: a call per key was most of its cost
            page = k >> _SHIFT
            if 0 <= page < pages:
                slot = table[page]
                if slot >= 0:
                    bit = (slot << _SHIFT) | (k & _MASK)
                    if buf[bit >> 3] & _BIT[bit & 7]:
                        continue
            out.append(k)
        return out

    def _slot(self, page: int) -> int:
        """The slot of `page`, which is given one (zeroed) if it has none."""
        table = self.table
        if page >= len(table):
            table.extend(repeat(-1, page + 1 - len(table) + page // 4))
        slot = table[page]
        if slot < 0:
            if self.free:
                slot = self.free.pop()
            else:
                slot = len(self.buf) // _PAGE_BYTES
                self.buf.extend(_EMPTY_PAGE)
            table[page] = slot
        return slot

    def add_many(self, keys: list[int]) -> None:
        """Add keys none of which is a member (dense ids, each once)."""
        if not keys:
            return
        buf = self.buf
        if len(keys) < _BATCH:
            table = self.table
            pages = len(table)
            for k in keys:
                page = k >> _SHIFT
                slot = table[page] if page < pages else -1
                if slot < 0:  # a page without a slot yet (or past the table): give it one
                    slot = self._slot(page)
                    pages = len(table)
                bit = (slot << _SHIFT) | (k & _MASK)
                buf[bit >> 3] |= _BIT[bit & 7]
        else:
            ids = np.fromiter(keys, np.int64, len(keys))
            id_pages = ids >> _SHIFT
            for page in np.unique(id_pages).tolist():
                self._slot(page)
            bits = self._bits(id_pages, ids)
            view = np.frombuffer(buf, np.uint8)
            np.bitwise_or.at(view, bits >> 3, np.left_shift(1, bits & 7).astype(np.uint8))
            del view
        self.count += len(keys)

    def _bits(self, pages: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Bit positions in `buf` of members `ids` on `pages` (which all have slots)."""
        table = np.frombuffer(self.table, np.int32)
        slots = table[pages].astype(np.int64)
        del table
        return (slots << _SHIFT) | (ids & _MASK)

    def remove_many(self, keys: list[int]) -> None:
        """Remove keys that are all members, each once; pages left empty give up their slots."""
        if not keys:
            return
        buf, table = self.buf, self.table
        if len(keys) < _BATCH:
            emptied = []
            for k in keys:
                slot = table[k >> _SHIFT]
                bit = (slot << _SHIFT) | (k & _MASK)
                byte = bit >> 3
                buf[byte] &= ~_BIT[bit & 7] & 0xFF
                if not buf[byte]:
                    emptied.append(k >> _SHIFT)
        else:
            ids = np.fromiter(keys, np.int64, len(keys))
            pages = ids >> _SHIFT
            bits = self._bits(pages, ids)
            view = np.frombuffer(buf, np.uint8)
            np.bitwise_and.at(view, bits >> 3, ~np.left_shift(1, bits & 7).astype(np.uint8))
            del view
            emptied = np.unique(pages).tolist()
        for page in emptied:
            slot = table[page]
            if slot >= 0 and buf[slot * _PAGE_BYTES : (slot + 1) * _PAGE_BYTES] == _EMPTY_PAGE:
                table[page] = -1
                self.free.append(slot)
        self.count -= len(keys)

    def members(self, ids: np.ndarray) -> np.ndarray:
        """A bool per id (any int64) whether it is a member."""
        table = np.frombuffer(self.table, np.int32)
        pages = ids >> _SHIFT
        out = np.zeros(ids.size, bool)
        inside = np.flatnonzero((ids >= 0) & (pages < table.size))
        slots = table[pages[inside]].astype(np.int64)
        del table
        held = slots >= 0
        at = inside[held]
        bits = (slots[held] << _SHIFT) | (ids[at] & _MASK)
        buf = np.frombuffer(self.buf, np.uint8)
        out[at] = ((buf[bits >> 3] >> (bits & 7).astype(np.uint8)) & 1).astype(bool)
        return out

    def __iter__(self) -> Iterator[int]:
        table = np.frombuffer(self.table, np.int32)
        pages = np.flatnonzero(table >= 0)
        slots = table[pages]
        del table
        rows = np.frombuffer(self.buf, np.uint8).reshape(-1, _PAGE_BYTES)[slots]
        bits = np.unpackbits(rows, axis=1, bitorder="little")
        page_at, offset = np.nonzero(bits)
        return iter(((pages[page_at] << _SHIFT) | offset).tolist())


def _as_ids(keys: list[int]) -> np.ndarray | None:
    """`keys` as int64, or None when one does not fit (it is then no dense id)."""
    try:
        return np.fromiter(keys, np.int64, len(keys))
    except OverflowError:
        return None


class DensePlacement:
    """Where each block of a replica's node-local tiers is, for dense block ids: one bitset
    per tier of landed copies, one dict of writes in flight (key -> ~tier)."""

    dense = True

    def __init__(self, tiers: int) -> None:
        self.landed = [Bits() for _ in range(tiers)]
        self.incoming: dict[int, int] = {}

    def __contains__(self, key: int) -> bool:
        return key in self.incoming or any(key in bits for bits in self.landed)

    def get(self, key: int, default: int = -1) -> int:
        code = self.incoming.get(key)
        if code is not None:
            return code
        for t, bits in enumerate(self.landed):
            if key in bits:
                return t
        return default

    def prefix(self, hashes: list[int], start: int, limit: int) -> list[int]:
        """Tier of each block `start, start+1, ...` of `hashes` whose copy has landed, up to
        the first that has none."""
        if start >= limit:
            return []
        landed = self.landed
        first = hashes[start]
        if len(landed) == 1:
            bits = landed[0]
            if first not in bits:  # the usual case: nothing below
                return []
            if limit - start < _BATCH:
                return [0] * len(list(takewhile(bits.__contains__, islice(hashes, start, limit))))
        elif not any(first in bits for bits in landed):
            return []
        ids = _as_ids(hashes[start:limit])
        if ids is None:
            found = list(takewhile(_landed, map(self.get, islice(hashes, start, limit))))
            return found
        codes = np.full(ids.size, -1, np.int8)
        for t in range(len(landed) - 1, -1, -1):
            codes[landed[t].members(ids)] = t
        missing = np.flatnonzero(codes < 0)
        end = int(missing[0]) if missing.size else ids.size
        if len(landed) == 1:
            return [0] * end
        return codes[:end].tolist()

    def not_held(self, keys: list[int]) -> list[int]:
        """The keys no tier holds or is being written."""
        if self.incoming:
            keys = list(filterfalse(self.incoming.__contains__, keys))
        for bits in self.landed:
            if keys and bits.count:
                keys = bits.absent(keys)
        return keys

    def write(self, keys: list[int], tier: int) -> None:
        """`keys` (held nowhere) are being written into `tier`."""
        self.incoming.update(dict.fromkeys(keys, ~tier))

    def cancel(self, keys: list[int]) -> None:
        """Writes of `keys` are dropped before they land."""
        consume(map(self.incoming.__delitem__, keys))

    def land(self, keys: list[int], tier: int) -> None:
        """The writes of `keys` into `tier` landed."""
        consume(map(self.incoming.__delitem__, keys))
        self.landed[tier].add_many(keys)

    def remove(self, keys: list[int], tier: int) -> None:
        """The copies of `keys` in `tier` are gone."""
        self.landed[tier].remove_many(keys)

    def items(self) -> Iterator[tuple[int, int]]:
        yield from self.incoming.items()
        for t, bits in enumerate(self.landed):
            for key in bits:
                yield key, t

    def values(self) -> Iterator[int]:
        return (t for _, t in self.items())

    def as_dict(self) -> dict[int, int]:
        return dict(self.items())


def _landed(code: int) -> bool:
    return code >= 0


class DictPlacement:
    """The same placement over one dict of any int keys (the hierarchy's original structure):
    the edge mapping for keys that are not dense ids."""

    dense = False

    def __init__(self, where: dict[int, int] | None = None) -> None:
        self.where: dict[int, int] = {} if where is None else where

    def __contains__(self, key: int) -> bool:
        return key in self.where

    def get(self, key: int, default: int = -1) -> int:
        return self.where.get(key, default)

    def prefix(self, hashes: list[int], start: int, limit: int) -> list[int]:
        lookups = map(self.where.get, islice(hashes, start, limit), repeat(-1))
        return list(takewhile(_landed, lookups))

    def not_held(self, keys: list[int]) -> list[int]:
        return list(filterfalse(self.where.__contains__, keys))

    def write(self, keys: list[int], tier: int) -> None:
        self.where.update(dict.fromkeys(keys, ~tier))

    def cancel(self, keys: list[int]) -> None:
        consume(map(self.where.__delitem__, keys))

    def land(self, keys: list[int], tier: int) -> None:
        self.where.update(dict.fromkeys(keys, tier))

    def remove(self, keys: list[int], tier: int) -> None:
        consume(map(self.where.__delitem__, keys))

    def items(self) -> Iterator[tuple[int, int]]:
        return iter(self.where.items())

    def values(self) -> Iterator[int]:
        return iter(self.where.values())

    def as_dict(self) -> dict[int, int]:
        return dict(self.where)


class CompactLRU(EvictionPolicy):
    """LRU over one tier's blocks as a FIFO of int32 ids with lazy deletion.

    A block's live entry is its newest; an older entry is stale. Instead of a per-key stamp
    (kvsim.policies.lru.LRU's dict), the queue counts, per key, its stale entries ahead of the
    live one (`_stale`): an entry is skipped while its key has stale entries left. Blocks leave
    the evictable set only by a tier's load (discard, always of an evictable block) or by
    eviction, so that dict holds only blocks read back while resident.

    `discard` must be called only for evictable blocks and `add` only for blocks that are not,
    as the hierarchy does (a block is evictable exactly while it has landed here and no load
    pins it); `forget` follows a removal the hierarchy has already made non-evictable."""

    name = "lru"

    def __init__(self) -> None:
        self._queue = array("i")
        self._head = 0
        self._live = 0
        self._stale: dict[int, int] = {}  # key -> stale entries of it in the queue
        self._stale_total = 0

    def add(self, key: int, info: BlockInfo) -> None:
        self._queue.append(key)
        self._live += 1

    def add_many(
        self, keys: list[int], positions: list[int], parents: Sequence[int], info: BlockInfo
    ) -> None:
        """Raises OverflowError, adding none, if a key does not fit an int32."""
        size = len(self._queue)
        try:
            self._queue.extend(keys)
        except OverflowError:
            del self._queue[size:]
            raise
        self._live += len(keys)

    def pin_many(self, keys: list[int], evictable: list[bool], info: BlockInfo) -> None:
        # a hit pins the block (as kvsim.policies.lru.LRU: no move to the MRU end first)
        if True in evictable:
            self.discard_many(list(compress(keys, evictable)))

    def discard(self, key: int) -> None:
        self._stale[key] = self._stale.get(key, 0) + 1
        self._stale_total += 1
        self._live -= 1
        self._compact()

    def discard_many(self, keys: list[int]) -> None:
        stale = self._stale
        for key in keys:
            stale[key] = stale.get(key, 0) + 1
        self._stale_total += len(keys)
        self._live -= len(keys)
        self._compact()

    def victim(self) -> int:
        queue, stale = self._queue, self._stale
        head = self._head
        while head < len(queue):
            key = queue[head]
            if key not in stale:
                self._head = head
                return key
            self._skip(key)
            head += 1
        self._head = head
        raise LookupError("no evictable block")

    def _consume(self, entries: list[int]) -> list[int]:
        """The live keys of these queue entries, in order; their stale entries are used up."""
        stale = self._stale
        flagged = list(map(stale.__contains__, entries))  # in C; usually none
        if True not in flagged:
            return entries
        keep = [True] * len(entries)
        for i in compress(range(len(entries)), flagged):
            key = entries[i]
            if key in stale:  # a later entry of a key whose stale ones ran out here is live
                self._skip(key)
                keep[i] = False
        return list(compress(entries, keep))

    def _skip(self, key: int) -> None:
        left = self._stale[key] - 1
        if left:
            self._stale[key] = left
        else:
            del self._stale[key]
        self._stale_total -= 1

    def evict(self, count: int) -> list[int]:
        if count > self._live:
            raise LookupError("no evictable block")
        queue, head = self._queue, self._head
        if not self._stale:  # every entry from the head on is live
            victims = queue[head : head + count].tolist()
            self._head = head + count
        else:
            victims = []
            while len(victims) < count:
                end = head + count - len(victims)
                victims += self._consume(queue[head:end].tolist())
                head = end
            self._head = head
        self._live -= count
        self._compact()
        return victims

    def _compact(self) -> None:
        """Drop consumed entries once they are half the queue, and stale ones once they
        outnumber live ones: O(live) memory."""
        if self._stale_total > self._live + 4096:
            kept = self._consume(self._queue[self._head :].tolist())
            self._queue, self._head = array("i", kept), 0
        elif self._head > 65536 and self._head * 2 > len(self._queue):
            del self._queue[: self._head]
            self._head = 0

    def order(self) -> list[int]:
        """The evictable blocks, least recently used first."""
        stale = dict(self._stale)
        out = []
        for key in self._queue[self._head :].tolist():
            left = stale.get(key, 0)
            if left:
                stale[key] = left - 1
            else:
                out.append(key)
        return out

    def to_lru(self) -> LRU:
        """The same order as a dict-keyed LRU (for a hierarchy moving to dicts)."""
        lru = LRU()
        keys = self.order()
        zeros = [0] * len(keys)
        lru.add_many(keys, zeros, zeros, BlockInfo())
        return lru

    def __len__(self) -> int:
        return self._live

"""The KV-cache manager: the one object a replica's scheduler asks about blocks.

It has the shape of vLLM v1's `KVCacheManager`: the scheduler asks what a waiting request would
get (`lookup`, after `get_computed_blocks`), admits it (`admit`, after `allocate_slots`), grows a
running request (`allocate_slots`), offers computed blocks to the prefix cache (`commit`) and
releases everything when the request finishes or is preempted (`free`). Behind it are the HBM
block pool, the tiers below HBM with their loads and prefetches, and position-independent
(RoPE-aware) reuse of document and tool segments. A request's block state is its `BlockTable`.

The scheduler (kvsim.engine.scheduler) calls only these, and never reaches past the manager
into its pool or tiers:

- admission: `available_blocks` (free now, evictable cached blocks included), `admission_bounds`
  (cheap bounds on a lookup's need; when they decide, the lookup is skipped), `lookup` (or
  `lookup_pull` for a request whose prompt a prefill replica computed), `first_layer_s` (when a
  layer-wise overlapped load's first layer would be in), `admit`, then `loaded` / `pulled` when
  its blocks from below or from the prefill replica have arrived;
- running: `allocate_slots` to grow, `commit` when blocks fill up, `compact` when a
  token-dropping compression ends a prefill, `rope_reused` (tokens re-rotated instead of
  computed), `hold_writes` / `release_writes` around a burst of allocations;
- leaving: `free` on finish or preemption; `prefetch` ahead of a session's next turn;
- settings it reads: `load_overlap`, `layers`, `rerotate_s_per_token`.

Statistics (`pool`, `hierarchy`, `block_ops`, the peaks) are read by result collection, the
cluster's snapshots for routers and the timeline, not by the scheduler.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import simpy

from kvsim.costmodel import CostModel
from kvsim.kvcache.block_pool import BlockPool
from kvsim.kvcache.block_table import BlockTable
from kvsim.kvcache.hierarchy import Hierarchy
from kvsim.kvcache.overlap import bidirectional_split, layerwise_s
from kvsim.kvcache.request import Request
from kvsim.policies.base import FutureFn
from kvsim.traces.blocks import mix

# (HBM hit blocks, how many of those are evictable, the tier of each block to load from below,
# tokens to compute now, new blocks needed). Under bidirectional load overlap the tier list may
# start with COMPUTE entries: cached blocks computed from the front while the rest load.
AdmitPlan = tuple[int, int, list[int], int, int]
COMPUTE = -1


class KVCacheManager:
    """HBM pool + lower tiers + segment reuse of one replica, wired together once, here."""

    def __init__(
        self,
        pool: BlockPool,
        hierarchy: Hierarchy | None,
        cost: CostModel | None,
        *,
        block_size: int,
        chunk_tokens: int,
        prefix_caching: bool,
        rope_reuse: bool,
        load_chain: Callable[[Request], None],
        rerotate_s_per_token: float,
        kind_names: tuple[str, ...] = (),
        future: FutureFn | None = None,
        load_overlap: str = "none",
        layers: int = 1,
    ) -> None:
        self.pool = pool
        self.hierarchy: Hierarchy | None = hierarchy if hierarchy else None
        self.cost = cost
        self.block_size = block_size
        self.chunk_tokens = chunk_tokens
        self.prefix_caching = prefix_caching
        self.rope_reuse = rope_reuse
        self.load_chain = load_chain
        self.rerotate_s_per_token = rerotate_s_per_token
        self.block_ops = 0
        self.prefetched_blocks = 0
        self.peak_used_blocks = 0  # most blocks running requests held at once
        self.load_overlap = load_overlap  # kvsim.kvcache.overlap: none, layerwise, bidirectional
        self.layers = layers  # the model's layers, the stages of a layer-wise load
        # position-independent reuse: segment hash -> block hashes holding its KV somewhere
        self.segment_blocks: dict[int, list[int]] = {}
        if hierarchy:
            pool.on_evict = hierarchy.evicted_from_hbm
            if hierarchy.write_through or not hierarchy.inclusive:
                pool.on_register = hierarchy.computed_in_hbm
        if future is not None and hierarchy:
            hierarchy.info.future = future
        if pool.describes:
            info = pool.info
            info.kind_names = kind_names
            if cost is not None:  # none in a cache-only replay: recompute times stay unknown
                info.recompute_base_s, info.recompute_per_position_s = cost.block_recompute_s(
                    block_size
                )
            info.future = future if pool.policy.needs_future else None
            if hierarchy:  # an evicted block falls to the first tier below: a chain's marginal
                # load time per block there, link idle (its latency is shared by the chain)
                est = hierarchy.load_estimate_s([0, 0])
                info.lower_load_s = float(est[1] - est[0])

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -- lookup (vLLM's get_computed_blocks) ------------------------------------------------
    @property
    def available_blocks(self) -> int:
        """HBM blocks a request could be given now (free or evictable)."""
        return self.pool.available

    def admission_bounds(self, req: Request, budget: int) -> tuple[int, int, int]:
        """(least, most, evictable): bounds on the blocks `lookup(req, budget)` would ask for,
        and its hit's evictable blocks, without walking the tiers below or costing a load.
        Its need is either the blocks of the next chunk after the hit, or the blocks it loads
        (at least one, at most every block from the hit up to `limit`), plus the reserved
        ones; when the bounds decide admission, the lookup need not run (it changes nothing)."""
        hit, evictable = self.prefix_hit(req)
        start = hit * self.block_size
        reserved = self.reserved_blocks(req)
        plain = self._blocks_for(start + min(req.known - start, budget)) - hit + reserved
        hashes = req.table.hashes
        if self.hierarchy is None or not self.prefix_caching or hashes is None:
            return plain, plain, evictable
        limit = min((req.known - 1) // self.block_size, len(hashes))
        return min(plain, 1 + reserved), max(plain, limit - hit + reserved), evictable

    def prefix_hit(self, req: Request) -> tuple[int, int]:
        """(cached leading blocks usable by `req`, how many of them are evictable now)."""
        table = req.table
        if table.hashes is None:
            self.load_chain(req)
        if not self.prefix_caching:
            return 0, 0
        assert table.hashes is not None
        # at least one token must be computed to sample from, as in vLLM
        limit = min((req.known - 1) // self.block_size, len(table.hashes))
        pool = self.pool
        memo = table.hit_memo
        # a queued request re-checked before this replica's cache changed (a memo taken on
        # another replica's pool, by a prefetch there, does not count)
        if memo is not None and memo[0] is pool and memo[1] == pool.version and memo[2] == limit:
            return memo[3], memo[4]
        if pool.head_granular:  # a lossy hit is priced with this request's attention
            pool.describe(table.kinds, req.input_tokens, req.hint)
        hit, evictable = pool.cached_prefix(table.hashes, limit)
        table.hit_memo = (pool, pool.version, limit, hit, evictable)
        return hit, evictable

    def lookup(self, req: Request, budget: int) -> AdmitPlan:
        """How `req` would be admitted now, with `budget` tokens left in the iteration."""
        hit, evictable = self.prefix_hit(req)
        if self.hierarchy is not None and self.prefix_caching:
            hashes = req.table.hashes
            assert hashes is not None
            limit = min((req.known - 1) // self.block_size, len(hashes))
            load = self._worth_loading(req, hit, self.hierarchy.chain(hashes, hit, limit))
            if load:
                return hit, evictable, load, 0, len(load) + self.reserved_blocks(req)
        start = hit * self.block_size
        n = min(req.known - start, budget)
        return hit, evictable, [], n, self._blocks_for(start + n) - hit + self.reserved_blocks(req)

    @staticmethod
    def reserved_blocks(req: Request) -> int:
        """Blocks a request holds beside its tokens' (quant's residual buffer), or 0."""
        comp = req.comp
        return 0 if comp is None else comp.reserved_blocks(req.input_tokens + req.output_tokens)

    def _worth_loading(
        self, req: Request, hit: int, found: list[int], overlap: str | None = None
    ) -> list[int]:
        """The prefix of `found` (tiers of blocks hit, hit+1, ...) worth loading: the one that
        minimises load time + the prefill left, against prefilling everything from `hit`.
        Both come from the cost model, so a memory-bound iteration's floor (weights are read
        whatever the chunk) is counted and deep blocks, whose recompute attends to more
        context, weigh more. Loads are costed on the links as loaded now. Empty when
        recomputing is never slower. With load overlap (`overlap`, else the manager's) the
        two are combined by kvsim.kvcache.overlap instead of added."""
        if not found:
            return found
        overlap = overlap or self.load_overlap
        if overlap != "none":
            return self._overlapped_plan(req, hit, found, overlap)
        bs = self.block_size
        chunk = self.chunk_tokens
        assert self.cost is not None  # loads happen only in the engine, which has one
        prefill = self.cost.prefill_time_s
        load_s = self.hierarchy.load_estimate_s(found)  # type: ignore[union-attr]
        best, best_s = 0, prefill(req.known - hit * bs, hit * bs, chunk)
        n = len(found)
        for count in sorted({n, *range(max(n // 8, 1), n, max(n // 8, 1))}):
            done = (hit + count) * bs
            total = load_s[count - 1] + prefill(req.known - done, done, chunk)
            if total < best_s:
                best, best_s = count, total
        return found[:best]

    def _overlapped_plan(self, req: Request, hit: int, found: list[int], overlap: str) -> list[int]:
        """`_worth_loading` when the load overlaps compute (kvsim.kvcache.overlap). layerwise:
        the prefix of `found` to load whose layer-pipelined finish, max(A/L + C, A + C/L), is
        least. bidirectional: load all of `found` from the back while computing its front,
        split where the two cross (the front as COMPUTE entries), then the rest of the prompt.
        Empty when recomputing everything is no slower."""
        assert self.cost is not None and self.hierarchy is not None
        bs = self.block_size
        chunk = self.chunk_tokens
        prefill = self.cost.prefill_time_s
        best, best_s = 0, prefill(req.known - hit * bs, hit * bs, chunk)
        n = len(found)
        if overlap == "layerwise":
            load_s = self.hierarchy.load_estimate_s(found)
            for count in sorted({n, *range(max(n // 8, 1), n, max(n // 8, 1))}):
                done = (hit + count) * bs
                rest = prefill(req.known - done, done, chunk)
                total = layerwise_s(float(load_s[count - 1]), rest, self.layers)
                if total < best_s:
                    best, best_s = count, total
            return found[:best]
        back_s = self.hierarchy.load_estimate_s(found[::-1])  # the last k blocks, k = 1, 2 ...

        def front(s: int) -> float:
            return prefill(s * bs, hit * bs, chunk) if s else 0.0

        def back(k: int) -> float:
            return float(back_s[k - 1]) if k else 0.0

        split, ready = bidirectional_split(n, front, back)
        end = (hit + n) * bs
        total = ready + prefill(req.known - end, end, chunk)
        if split == n or total >= best_s:
            return []
        return [COMPUTE] * split + found[split:]

    # -- admission (vLLM's allocate_slots for a new request) --------------------------------
    def first_layer_s(self, tiers: list[int]) -> float:
        """Seconds from now until the first layer of a load of blocks from `tiers` is in HBM,
        estimated on the links as they are loaded now (a layer-wise load overlaps compute)."""
        assert self.hierarchy is not None
        return float(self.hierarchy.load_estimate_s(tiers)[-1]) / self.layers

    def admit(self, req: Request, plan: AdmitPlan, now_s: float, first: bool) -> simpy.Event | None:
        """Pin the hit, allocate the rest, start loads from below; the event (if any) fires
        when the loaded blocks are in HBM, and `loaded` must then be called."""
        hit, _, load, _, need = plan
        pool = self.pool
        table = req.table
        assert table.hashes is not None
        done = None
        if load:  # pin the blocks below before allocating, which may push others down
            done = self._start_load(req, hit, load, first)
        if pool.describes:
            pool.describe(table.kinds, req.input_tokens, req.hint)
        pool.acquire(table.hashes, hit, now_s)
        if pool.head_granular:  # the hit this run is computed with (a re-admission's replaces it)
            req.lossy_hits = pool.lossy_blocks
            req.attention_mass_lost = pool.mass_lost
        pool.allocate(need)
        self.block_ops += hit + need
        req.computed = hit * self.block_size
        comp = req.comp
        if comp is not None:
            table.reserved = self.reserved_blocks(req)
            table.cache_limit = comp.cache_limit(
                req.input_tokens, req.input_tokens + req.output_tokens
            )
        table.held_blocks = hit + need - table.reserved
        self._held(req)
        table.held_cached = list(range(hit))
        table.processed_blocks = hit
        if not load and self.rope_reuse:
            self._rope_plan(req, hit * self.block_size)
        return done

    def _start_load(self, req: Request, hit: int, tiers: list[int], first: bool) -> simpy.Event:
        hierarchy = self.hierarchy
        hashes = req.table.hashes
        assert hashes is not None and hierarchy is not None
        end = hit + len(tiers)
        if tiers[0] == COMPUTE:  # bidirectional: the front is computed, only the back loads
            front = tiers.count(COMPUTE)
            hit, tiers = hit + front, tiers[front:]
        bs = self.block_size
        tokens = [bs if first else 0] * len(tiers)
        if first:
            req.lower_tokens = [0] * len(hierarchy.tiers)
            for t, blocks in Counter(tiers).items():
                req.lower_tokens[t] += bs * blocks
        return hierarchy.load(hashes[hit:end], tiers, tokens)

    def loaded(self, req: Request, end: int, now_s: float) -> None:
        """Blocks up to `end` arrived from below: cache them and count them computed."""
        pool = self.pool
        table = req.table
        assert table.hashes is not None
        if pool.reports_misses:
            pool.describe(table.kinds, req.input_tokens, req.hint)
        table.held_cached += pool.register(table.hashes, table.processed_blocks, end, now_s)
        self.block_ops += end - table.processed_blocks
        table.processed_blocks = end
        req.computed = end * self.block_size
        if self.rope_reuse:
            self._rope_plan(req, req.computed)

    # -- growth, commit, release ------------------------------------------------------------
    def allocate_slots(self, req: Request, need: int) -> bool:
        """`need` more blocks for a running request; False if the pool cannot give them."""
        if need <= 0:
            return True
        if not self.pool.allocate(need):
            return False
        req.table.held_blocks += need
        self.block_ops += need
        self._held(req)
        return True

    def _held(self, req: Request) -> None:
        """Keep the peaks the summary reports: the request's blocks, the pool's in use."""
        held = req.table.held_blocks + req.table.reserved
        if held > req.kv_peak_blocks:
            req.kv_peak_blocks = held
        used = self.pool.used
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used

    def compact(self, req: Request, now_s: float) -> None:
        """A token-dropping compression ends the prefill: the request keeps the pages its kept
        tokens fill (`EngineCompression.kept_blocks`) and frees the rest. Kept tokens no longer
        sit at their prefix positions, so cached blocks past the position-exact ones are
        unpinned (they stay cached for others: their content was not changed here). A request
        that never drops a token (`cache_limit` unlimited) keeps every page where it is."""
        comp = req.comp
        table = req.table
        assert comp is not None and table.hashes is not None
        table.compacted = True
        target = comp.kept_blocks(req.computed, max(req.computed - req.input_tokens, 0))
        exact = table.cache_limit  # every page, in a request that never drops a token
        cached = table.held_cached
        keep = [p for p in cached if p < exact]
        drop = cached[len(keep) :] if len(keep) < len(cached) else []
        held = max(target, len(keep))
        uncached_now = table.held_blocks - len(cached)
        freed = uncached_now - (held - len(keep))
        pool = self.pool
        if drop or freed > 0:
            if drop and pool.describes:
                pool.describe(table.kinds, req.input_tokens, req.hint)
            pool.release(table.hashes, drop, max(freed, 0), now_s)
        if freed < 0 and not pool.allocate(-freed):  # compacted pages replace unpinned hits
            # the pool cannot give them (others pin those hits too): the request keeps that
            # many of its hits pinned where they are instead
            back = drop[:-freed]
            pool.acquire([table.hashes[p] for p in back], len(back), now_s)
            keep += back
        self.block_ops += len(drop) + abs(freed)
        table.held_cached = keep
        table.held_blocks = held

    def hold_writes(self) -> None:
        """Batch the write-backs of the evictions that follow, until `release_writes`."""
        if self.hierarchy is not None:
            self.hierarchy.hold_writes()

    def release_writes(self) -> None:
        if self.hierarchy is not None:
            self.hierarchy.release_writes()

    def commit(self, req: Request, now_s: float) -> None:
        """Offer the request's newly full blocks to the prefix cache."""
        table = req.table
        hashes = table.hashes
        assert hashes is not None
        full = min(req.computed // self.block_size, len(hashes))
        if full <= table.processed_blocks:
            if full == len(hashes):  # past its chain: no block is offered, so skip the checks
                table.processed_blocks = req.computed // self.block_size
            return
        # a compressed request offers only its position-exact pages (up to `cache_limit`)
        end = full if full <= table.cache_limit else max(table.cache_limit, table.processed_blocks)
        if end > table.processed_blocks:
            pool = self.pool
            if pool.reports_misses:
                pool.describe(table.kinds, req.input_tokens, req.hint)
            table.held_cached += pool.register(hashes, table.processed_blocks, end, now_s)
            self.block_ops += end - table.processed_blocks
        table.processed_blocks = full
        if end == full and table.pic_segments:
            self._record_segments(req)

    def free(self, req: Request, now_s: float, table: BlockTable | None = None) -> None:
        """Release every block the request holds (its cached ones stay cached, deepest first);
        `table` when it is not the request's current one (a prefill replica's, after hand-off)."""
        table = table if table is not None else req.table
        assert table.hashes is not None
        uncached = table.held_blocks - len(table.held_cached) + table.reserved
        pool = self.pool
        if pool.describes:
            pool.describe(table.kinds, req.input_tokens, req.hint)
        pool.release(table.hashes, table.held_cached, uncached, now_s)
        self.block_ops += table.held_blocks + table.reserved

    # -- prefill/decode hand-off ----------------------------------------------------------------
    def lookup_pull(self, req: Request) -> AdmitPlan:
        """How a request whose prompt a prefill replica computed would be admitted here: the
        local prefix hit is kept, every other prompt block is pulled (nothing is computed)."""
        hit, evictable = self.prefix_hit(req)
        return hit, evictable, [], 0, self._blocks_for(req.input_tokens) - hit

    def pulled(self, req: Request, now_s: float) -> None:
        """The prompt's KV arrived: cache its full blocks; the last prompt token is left to the
        first decode step, which samples the first token (as vLLM's connector does)."""
        pool = self.pool
        table = req.table
        assert table.hashes is not None
        end = min(req.input_tokens // self.block_size, len(table.hashes))
        if end > table.processed_blocks:
            if pool.reports_misses:
                pool.describe(table.kinds, req.input_tokens, req.hint)
            table.held_cached += pool.register(table.hashes, table.processed_blocks, end, now_s)
            self.block_ops += end - table.processed_blocks
            table.processed_blocks = end
        req.computed = req.input_tokens - 1

    # -- prefetch ---------------------------------------------------------------------------
    def prefetch(self, req: Request, reserved_blocks: int, then: Callable[[], None]) -> None:
        """Start bringing `req`'s blocks from lower tiers into HBM as evictable cached blocks,
        ahead of its arrival (a session in think time or waiting on a tool), leaving
        `reserved_blocks` of the available ones alone; `then` is called once they are cached."""
        if self.hierarchy is None or not self.prefix_caching:
            return
        table = req.table
        if table.hashes is None:
            self.load_chain(req)
        hashes = table.hashes
        assert hashes is not None
        hit, _ = self.prefix_hit(req)
        limit = min((req.known - 1) // self.block_size, len(hashes))
        # a prefetch is off the critical path: nothing to overlap it with
        found = self.hierarchy.chain(hashes, hit, limit)
        tiers = self._worth_loading(req, hit, found, overlap="none")
        tiers = tiers[: max(self.pool.available - reserved_blocks, 0)]
        if not tiers:
            return
        count = len(tiers)
        end = hit + count
        done = self.hierarchy.load(hashes[hit:end], tiers, [0] * count)  # pins them first
        done.callbacks.append(lambda _ev: self._prefetched(hashes, hit, end, then))
        self.pool.allocate(count)

    def _prefetched(
        self, hashes: list[int], start: int, end: int, then: Callable[[], None]
    ) -> None:
        now = self.hierarchy.env.now  # type: ignore[union-attr]
        count = end - start
        self.prefetched_blocks += count
        fresh = self.pool.register(hashes, start, end, now)
        self.pool.release(hashes, fresh, count - len(fresh), now)
        then()

    # -- position-independent (RoPE-aware) reuse ---------------------------------------------
    def _record_segments(self, req: Request) -> None:
        """Remember where the KV of each reusable segment (document, tool output) now is: the
        request's full blocks inside it, once computed."""
        table = req.table
        assert table.hashes is not None and table.pic_segments is not None
        bs = self.block_size
        while table.pic_next < len(table.pic_segments):
            start, end, key = table.pic_segments[table.pic_next]
            if end > req.computed:
                return
            first, last = -(-start // bs), min(end // bs, len(table.hashes))
            if last > first:
                self.segment_blocks[_salted_key(key, req)] = table.hashes[first:last]
            table.pic_next += 1

    def _rope_plan(self, req: Request, start: int) -> None:
        """Which tokens after `start` `req` can take from a cached copy of the same segment at
        another position, by re-rotating its keys (RoPE is a rotation by position, so moving KV
        to a new position is one elementwise pass; cross-segment attention is not redone, the
        approximation CacheBlend and EPIC measure)."""
        table = req.table
        table.rope_ranges = None
        if not table.pic_segments:
            return
        refs = self.pool.refs
        ranges = []
        for seg_start, seg_end, key in table.pic_segments:
            if seg_start < start:
                continue
            blocks = self.segment_blocks.get(_salted_key(key, req))
            if blocks and all(k in refs for k in blocks):
                ranges.append((seg_start, min(seg_start + len(blocks) * self.block_size, seg_end)))
        table.rope_ranges = ranges or None

    def rope_reused(self, req: Request, lo: int, hi: int) -> int:
        """Tokens in [lo, hi) that `req` re-rotates instead of computing (counted on it)."""
        total = 0
        for start, end in req.table.rope_ranges or ():
            total += max(0, min(end, hi) - max(start, lo))
        req.rope_tokens += total
        return total


def _salted_key(key: int, req: Request) -> int:
    """A segment's key under the request's compression: KV written under one compression is
    never reused, at any position, by a request under another (salt 0: the key itself)."""
    comp = req.comp
    return key if comp is None or not comp.salt else int(mix(key, comp.salt, 0)[0])

"""One serving replica: vLLM-V1-style continuous batching as a single SimPy process.

Each iteration the scheduler walks the running requests first (a decode takes one token of the
budget, an unfinished prefill takes a chunk), then admits waiting requests in arrival order while
the token budget, `max_num_seqs` and free blocks allow. When a running request needs a block and
none is free, the most recently admitted request is preempted by recompute (vLLM's default): its
blocks are released (cached ones stay cached) and it goes back to the head of the queue.

The iteration time comes from the cost model. When every running request is decoding and no
waiting request can be admitted, the batch cannot change until a request finishes, an arrival
comes, or blocks run out; those iterations are run as one event (decode coalescing), and an arrival
in the middle cuts the run at the end of the step in progress.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import simpy

from kvsim.engine.config import EngineConfig
from kvsim.engine.request import Request
from kvsim.hardware.measured import CostModel
from kvsim.kvcache import BlockPool
from kvsim.kvcache.hierarchy import Hierarchy

MAX_COALESCED_STEPS = 4096


class Replica:
    """Scheduler + executor of one replica; `submit` a request, it calls `on_finish` when done."""

    def __init__(
        self,
        env: simpy.Environment,
        config: EngineConfig,
        pool: BlockPool,
        cost: CostModel,
        load_chain: Callable[[Request], None],
        on_finish: Callable[[Request], None],
        hierarchy: Hierarchy | None = None,
    ) -> None:
        self.env = env
        self.config = config
        self.pool = pool
        self.cost = cost
        self.load_chain = load_chain
        self.on_finish = on_finish
        self.block_size = config.block_size
        self.hierarchy = hierarchy if hierarchy else None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.loading: list[Request] = []  # admitted, waiting for blocks from lower tiers
        self.prefetched_blocks = 0
        self.run_reserved_blocks = 0  # blocks a coalesced decode run counted on: not for prefetch
        # position-independent reuse: segment hash -> block hashes holding its KV somewhere
        self.segment_blocks: dict[int, list[int]] = {}
        self.rerotate_s_per_token = 0.0  # set by the simulation from the KV bytes and HBM
        self.iterations = 0
        self.coalesced_steps = 0
        self.busy_s = 0.0
        self.block_ops = 0
        self._wake: simpy.Event | None = None
        self.process = env.process(self._loop())

    # -- arrivals ----------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        request.arrival_s = self.env.now
        self.waiting.append(request)
        self._notify()

    def _notify(self) -> None:
        """Something changed that may let the batch change: wake an idle loop or cut a run."""
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    # -- main loop ---------------------------------------------------------------------------------
    def _loop(self):
        env = self.env
        while True:
            if not self.running and not self.waiting:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if self.config.coalesce_decode and self._decode_only():
                steps = self._coalescible_steps()
                if steps >= 2:
                    yield from self._decode_run(steps)
                    continue
            batch = self._schedule()
            if not batch:
                # nothing fits even an empty replica: impossible requests were rejected upstream,
                # so this only happens when waiting requests wait for running ones; wait for work
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            prefill = []
            decode = []
            rotated = 0
            for req, n in batch:
                if n == 1:
                    decode.append(req.computed)
                    continue
                if req.rope_ranges:  # tokens reused at a new position: re-rotated, not computed
                    reused = self._rope_overlap(req, req.computed, req.computed + n)
                    rotated += reused
                    n -= reused
                if n:
                    prefill.append((n, req.computed))
            duration = self.cost.iteration_time_s(prefill, decode)
            duration += rotated * self.rerotate_s_per_token
            yield env.timeout(duration)
            self.busy_s += duration
            self.iterations += 1
            self._complete(batch)

    # -- scheduling --------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _schedule(self) -> list[tuple[Request, int]]:
        budget = self.config.max_num_batched_tokens
        pool = self.pool
        batch: list[tuple[Request, int]] = []
        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.known - req.computed, budget)
            need = self._blocks_for(req.computed + n) - req.held_blocks
            while need > 0 and not pool.allocate(need):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                req.held_blocks += max(need, 0)
                self.block_ops += max(need, 0)
                batch.append((req, n))
                budget -= n
                i += 1
                continue
            break  # the current request preempted itself
        if not preempted:
            self._admit(batch, budget)
        return batch

    def _prefix_hit(self, req: Request) -> tuple[int, int]:
        """(cached leading blocks usable by `req`, how many of them are evictable now)."""
        if req.hashes is None:
            self.load_chain(req)
        if not self.config.enable_prefix_caching:
            return 0, 0
        # at least one token must be computed to sample from, as in vLLM
        limit = min((req.known - 1) // self.block_size, len(req.hashes))
        memo = req.hit_memo
        if memo is not None and memo[0] == self.pool.version and memo[1] == limit:
            return memo[2], memo[3]  # a queued request re-checked before the cache changed
        hit, evictable = self.pool.cached_prefix(req.hashes, limit)
        req.hit_memo = (self.pool.version, limit, hit, evictable)
        return hit, evictable

    def _plan(self, req: Request, budget: int) -> tuple[int, int, list[int], int, int]:
        """How `req` would be admitted now: (HBM hit blocks, how many of those are evictable,
        the tier of each block to load from below, tokens to compute now, new blocks needed)."""
        hit, evictable = self._prefix_hit(req)
        if self.hierarchy is not None and self.config.enable_prefix_caching:
            assert req.hashes is not None
            limit = min((req.known - 1) // self.block_size, len(req.hashes))
            load = self._worth_loading(req, hit, self.hierarchy.chain(req.hashes, hit, limit))
            if load:
                return hit, evictable, load, 0, len(load)
        start = hit * self.block_size
        n = min(req.known - start, budget)
        return hit, evictable, [], n, self._blocks_for(start + n) - hit

    def _worth_loading(self, req: Request, hit: int, found: list[int]) -> list[int]:
        """The prefix of `found` (tiers of blocks hit, hit+1, ...) worth loading: the one that
        minimises load time + the prefill left, against prefilling everything from `hit`.
        Both come from the cost model, so a memory-bound iteration's floor (weights are read
        whatever the chunk) is counted and deep blocks, whose recompute attends to more
        context, weigh more. Loads are costed on the links as loaded now. Empty when
        recomputing is never slower."""
        if not found:
            return found
        bs = self.block_size
        chunk = self.config.max_num_batched_tokens
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

    def _admit(self, batch: list[tuple[Request, int]], budget: int) -> None:
        waiting = self.waiting
        running = self.running
        pool = self.pool
        max_seqs = self.config.max_num_seqs
        bs = self.block_size
        now = self.env.now
        while waiting and budget > 0 and len(running) + len(self.loading) < max_seqs:
            req = waiting[0]
            hit, evictable, load, n, need = self._plan(req, budget)
            if need + evictable > pool.available:
                break
            waiting.popleft()
            assert req.hashes is not None
            first = req.cached_tokens < 0
            if first:
                req.cached_tokens = hit * bs
                req.scheduled_s = now
            if load:  # pin the blocks below before allocating, which may push others down
                self._start_load(req, hit, load, first)
            if pool.describes:
                pool.describe(req.kinds, req.input_tokens)
            pool.acquire(req.hashes, hit, now)
            pool.allocate(need)
            self.block_ops += hit + need
            req.computed = hit * bs
            req.held_blocks = hit + need
            req.held_cached = list(range(hit))
            req.processed_blocks = hit
            if load:
                continue
            if self.config.rope_reuse:
                self._rope_plan(req, hit * bs)
            running.append(req)
            batch.append((req, n))
            budget -= n

    # -- loads from lower tiers -------------------------------------------------------------
    def _start_load(self, req: Request, hit: int, tiers: list[int], first: bool) -> None:
        assert req.hashes is not None and self.hierarchy is not None
        end = hit + len(tiers)
        tokens = [self.block_size if first else 0] * len(tiers)
        if first:
            req.lower_tokens = [0] * len(self.hierarchy.tiers)
            for t in tiers:
                req.lower_tokens[t] += self.block_size
        req.load_started_s = self.env.now
        self.loading.append(req)
        done = self.hierarchy.load(req.hashes[hit:end], tiers, tokens)
        done.callbacks.append(lambda _ev: self._loaded(req, end))

    def _loaded(self, req: Request, end: int) -> None:
        now = self.env.now
        req.load_wait_s += now - req.load_started_s
        self.loading.remove(req)
        assert req.hashes is not None
        if self.pool.reports_misses:
            self.pool.describe(req.kinds, req.input_tokens)
        req.held_cached += self.pool.register(req.hashes, req.processed_blocks, end, now)
        self.block_ops += end - req.processed_blocks
        req.processed_blocks = end
        req.computed = end * self.block_size
        if self.config.rope_reuse:
            self._rope_plan(req, req.computed)
        self.running.append(req)
        self._notify()

    def prefetch(self, req: Request) -> None:
        """Bring `req`'s blocks from lower tiers into HBM as evictable cached blocks, ahead of
        its arrival (a session in think time or waiting on a tool)."""
        if self.hierarchy is None or not self.config.enable_prefix_caching:
            return
        if req.hashes is None:
            self.load_chain(req)
        assert req.hashes is not None
        hashes = req.hashes
        hit, _ = self._prefix_hit(req)
        limit = min((req.known - 1) // self.block_size, len(hashes))
        tiers = self._worth_loading(req, hit, self.hierarchy.chain(hashes, hit, limit))
        # a coalesced decode run in progress has counted on some of the available blocks
        tiers = tiers[: max(self.pool.available - self.run_reserved_blocks, 0)]
        if not tiers:
            return
        count = len(tiers)
        end = hit + count
        done = self.hierarchy.load(hashes[hit:end], tiers, [0] * count)  # pins them first
        done.callbacks.append(lambda _ev: self._prefetched(hashes, hit, end))
        self.pool.allocate(count)

    def _prefetched(self, hashes: list[int], start: int, end: int) -> None:
        now = self.env.now
        count = end - start
        self.prefetched_blocks += count
        fresh = self.pool.register(hashes, start, end, now)
        self.pool.release(hashes, fresh, count - len(fresh), now)
        self._notify()

    def _preempt(self, req: Request) -> None:
        self._release(req)
        req.preemptions += 1
        req.reset_kv()
        self.waiting.appendleft(req)

    def _release(self, req: Request) -> None:
        assert req.hashes is not None
        uncached = req.held_blocks - len(req.held_cached)
        if self.pool.describes:
            self.pool.describe(req.kinds, req.input_tokens)
        self.pool.release(req.hashes, req.held_cached, uncached, self.env.now)
        self.block_ops += req.held_blocks

    # -- completing an iteration -------------------------------------------------------------------
    def _register_full_blocks(self, req: Request) -> None:
        hashes = req.hashes
        assert hashes is not None
        full = min(req.computed // self.block_size, len(hashes))
        if full <= req.processed_blocks:
            return
        if self.pool.reports_misses:
            self.pool.describe(req.kinds, req.input_tokens)
        req.held_cached += self.pool.register(hashes, req.processed_blocks, full, self.env.now)
        self.block_ops += full - req.processed_blocks
        req.processed_blocks = full
        if req.pic_segments:
            self._record_segments(req)

    # -- position-independent (RoPE-aware) reuse ---------------------------------------------
    def _record_segments(self, req: Request) -> None:
        """Remember where the KV of each reusable segment (document, tool output) now is: the
        request's full blocks inside it, once computed."""
        assert req.hashes is not None and req.pic_segments is not None
        bs = self.block_size
        while req.pic_next < len(req.pic_segments):
            start, end, key = req.pic_segments[req.pic_next]
            if end > req.computed:
                return
            first, last = -(-start // bs), min(end // bs, len(req.hashes))
            if last > first:
                self.segment_blocks[key] = req.hashes[first:last]
            req.pic_next += 1

    def _rope_plan(self, req: Request, start: int) -> None:
        """Which tokens after `start` `req` can take from a cached copy of the same segment at
        another position, by re-rotating its keys (RoPE is a rotation by position, so moving KV
        to a new position is one elementwise pass; cross-segment attention is not redone, the
        approximation CacheBlend and EPIC measure)."""
        req.rope_ranges = None
        if not req.pic_segments:
            return
        refs = self.pool.refs
        ranges = []
        for seg_start, seg_end, key in req.pic_segments:
            if seg_start < start:
                continue
            blocks = self.segment_blocks.get(key)
            if blocks and all(k in refs for k in blocks):
                ranges.append((seg_start, min(seg_start + len(blocks) * self.block_size, seg_end)))
        req.rope_ranges = ranges or None

    def _rope_overlap(self, req: Request, lo: int, hi: int) -> int:
        total = 0
        for start, end in req.rope_ranges or ():
            total += max(0, min(end, hi) - max(start, lo))
        req.rope_tokens += total
        return total

    def _complete(self, batch: list[tuple[Request, int]]) -> None:
        now = self.env.now
        finished = False
        for req, n in batch:
            req.computed += n
            self._register_full_blocks(req)
            if req.computed == req.known:
                req.generated += 1
                req.known += 1
                if req.first_token_s < 0:
                    req.first_token_s = now
                if req.generated >= req.output_tokens:
                    self._finish(req, now)
                    finished = True
        if finished:
            self.running = [r for r in self.running if r.finish_s < 0]

    def _finish(self, req: Request, now: float) -> None:
        req.finish_s = now
        self._release(req)
        req.hashes = req.kinds = None  # the trace can rebuild them: memory stays flat
        self.on_finish(req)

    # -- decode coalescing -------------------------------------------------------------------------
    def _decode_only(self) -> bool:
        running = self.running
        if not running or len(running) > self.config.max_num_batched_tokens:
            return False
        for req in running:
            if req.known - req.computed != 1:
                return False
        if not self.waiting or len(running) + len(self.loading) >= self.config.max_num_seqs:
            return True
        # the head of the queue cannot be admitted now, and decoding only takes blocks away
        budget = self.config.max_num_batched_tokens - len(running)
        if budget <= 0:
            return True
        _, evictable, _, _, need = self._plan(self.waiting[0], budget)
        return need + evictable > self.pool.available

    def _blocks_needed(self, computed: np.ndarray, held: np.ndarray, steps: int) -> int:
        bs = self.block_size
        return int(np.maximum(-(-(computed + steps) // bs) - held, 0).sum())

    @staticmethod
    def _block_counts(running: list[Request]) -> tuple[np.ndarray, np.ndarray]:
        """(tokens computed, blocks held) of each running request."""
        computed = np.fromiter((r.computed for r in running), dtype=np.int64, count=len(running))
        held = np.fromiter((r.held_blocks for r in running), dtype=np.int64, count=len(running))
        return computed, held

    def _coalescible_steps(self) -> int:
        """Steps the decode batch can run unchanged: until the first finish, within free blocks."""
        running = self.running
        steps = min(r.output_tokens - r.generated for r in running)
        steps = min(steps, MAX_COALESCED_STEPS)
        computed, held = self._block_counts(running)
        available = self.pool.available
        if self._blocks_needed(computed, held, steps) <= available:
            return steps
        lo, hi = 0, steps  # largest step count whose blocks fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._blocks_needed(computed, held, mid) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _decode_run(self, steps: int):
        env = self.env
        running = list(self.running)  # the batch of this run; a load may append to the list
        contexts = np.fromiter((r.computed for r in running), dtype=np.float64, count=len(running))
        ends = self.cost.decode_run_ends_s(contexts, steps)
        self.run_reserved_blocks = self._blocks_needed(*self._block_counts(running), steps)
        start = env.now
        self._wake = env.event()
        yield env.timeout(float(ends[-1])) | self._wake
        cut = self._wake.triggered and env.now - start < float(ends[-1])
        self._wake = None
        done = steps
        if cut:
            elapsed = env.now - start
            step = int(np.searchsorted(ends, elapsed, side="left"))
            done = min(step + 1, steps)
            remaining = float(ends[done - 1]) - elapsed
            if remaining > 0:
                yield env.timeout(remaining)
        self.run_reserved_blocks = 0
        duration = float(ends[done - 1])
        self.busy_s += duration
        self.iterations += done
        self.coalesced_steps += done
        self._advance_decode(running, done, first_step_end_s=start + float(ends[0]))

    def _advance_decode(self, batch: list[Request], steps: int, first_step_end_s: float) -> None:
        """Apply `steps` decode steps to the requests that ran them (a request that joined the
        running list during the run, e.g. when its load finished, did not)."""
        now = self.env.now
        pool = self.pool
        finished = False
        for req in batch:
            need = self._blocks_for(req.computed + steps) - req.held_blocks
            if need > 0:
                ok = pool.allocate(need)
                assert ok, "coalesced decode ran out of blocks it had counted"
                req.held_blocks += need
                self.block_ops += need
            if req.generated == 0:  # its last prompt token went in the first step
                req.first_token_s = first_step_end_s
            req.computed += steps
            req.generated += steps
            req.known += steps
            self._register_full_blocks(req)
            if req.generated >= req.output_tokens:
                self._finish(req, now)
                finished = True
        if finished:
            self.running = [r for r in self.running if r.finish_s < 0]

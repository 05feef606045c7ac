"""The scheduler of one serving replica: vLLM-V1-style continuous batching as one SimPy process.

Each iteration the scheduler walks the running requests first (a decode takes one token of the
budget, an unfinished prefill takes a chunk), then admits waiting requests in arrival order while
the token budget, `max_num_seqs` and free blocks allow. When a running request needs a block and
none is free, the most recently admitted request is preempted by recompute (vLLM's default): its
blocks are released (cached ones stay cached) and it goes back to the head of the queue.

A load from lower tiers may overlap compute (`load_overlap`, kvsim.kvcache.overlap): the request
then runs while its load is in flight, behind a `LoadGate` (kvsim.engine.gates).

The iteration time comes from the replica's pricer (kvsim.engine.pricing), chosen when the
replica is built. When every running request is decoding and no waiting request can be admitted,
the batch cannot change until a request finishes, an arrival comes, or blocks run out; those
iterations are run as one event (decode coalescing), and an arrival in the middle cuts the run
at the end of the step in progress.

Blocks are the KV-cache manager's business: the scheduler asks it through the few calls listed
in kvsim.kvcache.manager's docstring and never reaches past it into the pool or the tiers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import repeat
from operator import add, attrgetter, eq, floordiv, sub

import numpy as np
import simpy

from kvsim.engine.config import EngineConfig
from kvsim.engine.gates import LoadGate, gated_iteration
from kvsim.engine.handoff import Handoff
from kvsim.engine.pricing import IterationPricer
from kvsim.kvcache.block_table import BlockTable
from kvsim.kvcache.manager import COMPUTE, KVCacheManager
from kvsim.kvcache.request import Request

MAX_COALESCED_STEPS = 4096
#: a decode batch up to this size counts its blocks in lists (C-level maps: 3 us for 5
#: requests against numpy's 9 us; they break even near 30)
SMALL_BATCH = 24

BlockCounts = list[int] | np.ndarray

# per-request fields read across the whole running list, in C (map) rather than a genexpr
_known = attrgetter("known")
_computed = attrgetter("computed")
_generated = attrgetter("generated")
_output_tokens = attrgetter("output_tokens")
_held_blocks = attrgetter("table.held_blocks")
_is_one = partial(eq, 1)


def _relay(over: simpy.Event, _event: simpy.Event) -> None:
    """Trigger `over` unless an earlier event already has."""
    if not over.triggered:
        over.succeed()


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _block_counts(running: list[Request], small: bool) -> tuple[BlockCounts, BlockCounts]:
    """(tokens computed, blocks held) of each running request: lists for a `small` batch,
    where C-level maps over them beat numpy's fixed cost per call, else arrays."""
    if small:
        return list(map(_computed, running)), list(map(_held_blocks, running))
    computed = np.fromiter(map(_computed, running), dtype=np.int64, count=len(running))
    held = np.fromiter(map(_held_blocks, running), dtype=np.int64, count=len(running))
    return computed, held


def _kept_blocks_needed(
    running: list[Request], computed: np.ndarray, held: np.ndarray, steps: int, block_size: int
) -> int:
    """Blocks `steps` more decode steps of `running` take when compacted requests hold only
    their kept tokens' blocks."""
    total = 0
    for req, c, h in zip(running, computed.tolist(), held.tolist(), strict=True):
        t = c + steps
        if req.table.compacted:
            blocks = req.comp.kept_blocks(t, t - req.input_tokens)  # type: ignore[union-attr]
        else:
            blocks = -(-t // block_size)
        if blocks > h:
            total += blocks - h
    return total


class Scheduler:
    """Scheduler + executor of one replica; `submit` a request, it calls `on_finish` when done.

    Blocks are the KV-cache manager's business: the scheduler asks it what a request would get
    (`lookup`), admits (`admit`), grows (`allocate_slots`), commits and frees. Iterations are
    priced by `pricer`."""

    def __init__(
        self,
        env: simpy.Environment,
        config: EngineConfig,
        kv: KVCacheManager,
        pricer: IterationPricer,
        on_finish: Callable[[Request], None],
        index: int = 0,
        role: str = "mixed",
        node: int = 0,
        handoff: Handoff | None = None,
    ) -> None:
        self.env = env
        self.config = config
        # kvsim.engine.resolve gives every run these (an engine profile's, where the user left
        # them unset)
        assert config.max_num_seqs is not None and config.max_num_batched_tokens is not None
        self.max_num_seqs: int = config.max_num_seqs
        self.max_num_batched_tokens: int = config.max_num_batched_tokens
        self.kv = kv
        self.pricer = pricer
        self.on_finish = on_finish
        self.index = index
        self.role = role  # "mixed", or under P/D "prefill" / "decode"
        self.node = node
        # a prefill replica hands each prompt on instead of decoding: nothing to coalesce
        self.coalesce = config.coalesce_decode and role != "prefill"
        # SGLang's default (enable_mixed_chunk off): an iteration is all prefill or all decode,
        # prefill first; a decode replica under P/D only decodes, so it always mixes
        self.prefill_first = config.mixed_batches is False and role != "decode"
        # the serving front end's per-request work (API server, tokenisation)
        self.request_overhead_s = pricer.cost.request_overhead_s
        # an engine that schedules one step ahead (vLLM V1's async scheduling, SGLang's and
        # TensorRT-LLM's overlap schedulers) decided the next iteration's batch when the one in
        # flight started: a request reaching it meanwhile waits out the next iteration too
        # (the cost model's clock knows it, measured or roofline alike)
        self.schedules_ahead = pricer.cost.clock.overlap
        self.in_flight = False  # an iteration or a coalesced run is on the GPU
        # (time taken in, request) of those that arrived while one was: for the batch after next
        self.next_round: list[tuple[float, Request]] = []
        # a token-dropping compression: decoding requests hold only their kept tokens' blocks
        self.compacting = pricer.compacting
        # P/D: a prompt computed here goes on to its decode replica; a decode replica pulls a
        # request's prompt KV from its prefill replica (None: aggregated serving)
        self.handoff = handoff
        self.outstanding_tokens = 0  # tokens requests here still have to compute (for routers)
        self.arriving = 0  # requests in the front end, not queued yet (for routers)
        self.block_size = config.block_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.loading: list[Request] = []  # admitted, waiting for blocks from lower tiers
        self.run_reserved_blocks = 0  # blocks a coalesced decode run counted on: not for prefetch
        self.round_left = 0  # multi-step: decode steps left in the current round
        self.overlap = kv.load_overlap  # none, layerwise or bidirectional
        self.gated = 0  # running requests whose load is still in flight
        self.iterations = 0
        self.coalesced_steps = 0
        self.busy_s = 0.0
        self._wake: simpy.Event | None = None
        self.process = env.process(self._loop())

    # -- arrivals ----------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """A new request arrives: after the serving front end's per-request work (API server,
        tokenisation: the profile's ``request_overhead_s``) it joins the queue. Routers see it
        here from the start (in `arriving`), or a burst would all be sent to one idle replica."""
        request.arrival_s = self.env.now
        if self.request_overhead_s > 0:
            self._claim(request)
            self.arriving += 1
            done = self.env.timeout(self.request_overhead_s)
            done.callbacks.append(partial(self._after_front_end, request))
        else:
            self.enqueue(request)

    def _after_front_end(self, request: Request, _event: simpy.Event) -> None:
        self.arriving -= 1
        self._queue(request)

    def enqueue(self, request: Request) -> None:
        """Queue a request that has already arrived (e.g. handed on by a prefill replica)."""
        self._claim(request)
        self._queue(request)

    def _queue(self, request: Request) -> None:
        """The engine core takes a request in. One that schedules ahead and has an iteration in
        flight already chose the next batch, so the request waits for the batch after it
        (`_release_next_round`, when the next iteration starts); else it can join the next."""
        if self.schedules_ahead and self.in_flight:
            self.next_round.append((self.env.now, request))
        else:
            self.waiting.append(request)
        self._notify()

    def _release_next_round(self, before: float = float("inf")) -> None:
        """An iteration starts (at ``before``, in a coalesced run): requests held for the batch
        after it, taken in before it started, join the queue."""
        if self.next_round:
            self.waiting.extend(req for t, req in self.next_round if t < before)
            self.next_round = [(t, req) for t, req in self.next_round if t >= before]

    def _claim(self, request: Request) -> None:
        """`request` is this replica's: its tokens to compute count in the load routers see."""
        request.replica = self.index
        self.outstanding_tokens += request.known - request.computed

    def wake(self) -> None:
        """Blocks were freed from outside the scheduler (a P/D pull finished): look again."""
        self._notify()

    def _notify(self) -> None:
        """Something changed that may let the batch change: wake an idle loop or cut a run."""
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    # -- main loop ---------------------------------------------------------------------------------
    def _loop(self):
        env = self.env
        kv = self.kv
        price = self.pricer.iteration_s
        while True:
            if not self.running and not self.waiting:
                if self.next_round:  # an idle engine core schedules what it has at once
                    self._release_next_round()
                    continue
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if self._in_round():
                # multi-step: a round of decode steps runs to its end before the scheduler
                # looks at the queue again
                self.round_left = self.round_left or self.config.num_scheduler_steps
                steps, need = self._coalescible_steps()
                if steps >= 1:
                    yield from self._decode_run(min(steps, self.round_left), need)
                    continue
                self.round_left = 0  # out of blocks: schedule (and preempt) as usual
            # nothing waiting can join: the batch can only decode until something finishes
            # (a request held for the batch after next must join after one more step)
            if (
                self.coalesce
                and not self.next_round
                and self._all_decoding()
                and self._cannot_admit()
            ):
                steps, need = self._coalescible_steps()
                if steps >= 2:
                    yield from self._decode_run(steps, need)
                    continue
            decoders, batch = self._schedule()
            if not decoders and not batch:
                # nothing fits even an empty replica: impossible requests were rejected upstream,
                # so this only happens when waiting requests wait for running ones; wait for work
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            prefill = []
            decode = list(map(_computed, decoders))
            rotated = 0
            for req, n in batch:
                if n == 1:
                    decode.append(req.computed)
                    continue
                if req.table.rope_ranges:  # tokens reused at a new position: re-rotated
                    reused = kv.rope_reused(req, req.computed, req.computed + n)
                    rotated += reused
                    n -= reused
                if n:
                    prefill.append((n, req.computed))
            duration, fetch = price(decoders, batch, prefill, decode)
            duration += rotated * kv.rerotate_s_per_token
            self._release_next_round()
            self.in_flight = True
            if self.gated:
                yield from gated_iteration(env, batch, duration, kv.layers)
            elif fetch:
                start = env.now
                yield from self.pricer.fetching(duration, fetch)
                duration = env.now - start
            else:
                yield env.timeout(duration)
            self.in_flight = False
            self.busy_s += duration
            self.iterations += 1
            self._complete(decoders, batch)

    # -- scheduling --------------------------------------------------------------------------------
    def _waits_to_fit_whole(self, prompt: int, n: int) -> bool:
        """Without chunked prefill a prompt that does not fit beside the batch (only ``n`` of
        its ``prompt`` tokens would) waits for the next iteration; one longer than any
        iteration's budget could never fit whole and is chunked anyway."""
        if self.config.chunked_prefill or n >= prompt:
            return False
        return prompt <= self.max_num_batched_tokens

    def _reservation(self, req: Request, need: int) -> int:
        """Blocks that must stay free beyond ``need`` for ``req`` to start: none when only the
        prompt is reserved; with ``kv_reservation = full`` (TensorRT-LLM's GUARANTEED_NO_EVICT)
        the rest of its own output and what every started request may still grow by."""
        if self.config.kv_reservation != "full":
            return 0
        bs = self.block_size
        held = sum(
            max(0, _blocks_for(r.input_tokens + r.output_tokens, bs) - r.table.held_blocks)
            for r in (*self.running, *self.loading)
        )
        prompt = _blocks_for(req.known, bs)
        return held + max(0, _blocks_for(req.input_tokens + req.output_tokens, bs) - prompt)

    def _schedule(self) -> tuple[list[Request], list[tuple[Request, int]]]:
        """This iteration's requests, in running order then admitted: (the leading running
        requests that decode a token of a started output, most of a batch, which `_complete`
        applies without the general case's checks; (request, tokens) for the rest)."""
        budget = self.max_num_batched_tokens
        kv = self.kv
        batch: list[tuple[Request, int]] = []
        running = self.running
        preempted = False
        bs = self.block_size
        i = 0
        prefill_only = self.prefill_first and self._prefill_pending()
        kv.hold_writes()  # released before admission, which looks blocks up below HBM
        if not self.compacting and not prefill_only:  # compacting decode may shrink blocks
            # generated > 0: its first token is out (and, under P/D, it decodes here). Its
            # blocks hold its computed tokens, so it needs one only once its last is full (the
            # table, another object to fetch from memory, is read 1 step in block_size)
            limit = min(len(running), budget)
            while i < limit:
                req = running[i]
                c = req.computed
                if req.known - c != 1 or req.gate is not None or not req.generated:
                    break
                if not c % bs:
                    need = c // bs + 1 - req.table.held_blocks
                    if need > 0 and not kv.allocate_slots(req, need):
                        break  # out of blocks: the loop below preempts
                i += 1
            budget -= i
        decoders = running[:i]
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.computed
            n = req.known - computed
            if prefill_only and n == 1 and req.generated:  # decodes wait for the prefills
                i += 1
                continue
            if n > budget:
                n = budget
            gate = req.gate
            if gate is not None and gate.stop >= 0:  # bidirectional: only the front, for now
                n = min(gate.stop - computed, budget)
                if n <= 0:
                    i += 1
                    continue
            table = req.table
            if table.compacted:
                t = computed + n
                need = req.comp.kept_blocks(t, t - req.input_tokens) - table.held_blocks  # type: ignore[union-attr]
            else:  # inline ceil: this runs once per running request per iteration
                need = -(-(computed + n) // bs) - table.held_blocks
            if need <= 0:  # the usual decode step: its last block has room (no call needed)
                batch.append((req, n))
                budget -= n
                i += 1
                continue
            while not kv.allocate_slots(req, need):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                batch.append((req, n))
                budget -= n
                i += 1
                continue
            break  # the current request preempted itself
        kv.release_writes()
        if not preempted:
            self._admit(batch, budget)
        if prefill_only and not batch:  # nothing to prefill after all (blocks): decode
            self.prefill_first = False
            try:
                return self._schedule()
            finally:
                self.prefill_first = True
        return decoders, batch

    def _prefill_pending(self) -> bool:
        """A prefill iteration has work: a running request still prefilling, or a waiting one
        that can be admitted now."""
        for req in self.running:
            if req.known - req.computed != 1 or not req.generated:
                return True
        return not self._cannot_admit()

    def _admit(self, batch: list[tuple[Request, int]], budget: int) -> None:
        waiting = self.waiting
        running = self.running
        kv = self.kv
        max_seqs = self.max_num_seqs
        whole = self.max_num_batched_tokens  # budget left whole: nothing scheduled yet
        bs = self.block_size
        now = self.env.now
        while waiting and budget > 0 and len(running) + len(self.loading) < max_seqs:
            req = waiting[0]
            pulling = req.handoff == "decode"
            if not pulling:  # a head that cannot fit whatever the lookup finds below: stop
                least, _, evictable = kv.admission_bounds(req, budget)
                if least + evictable + self._reservation(req, least) > kv.available_blocks:
                    break
            plan = kv.lookup_pull(req) if pulling else kv.lookup(req, budget)
            hit, evictable, load, n, need = plan
            if need + evictable + self._reservation(req, need) > kv.available_blocks:
                break
            # a pull computes nothing here: the whole-prompt rule is for prompts it computes
            if budget < whole and not pulling and self._waits_to_fit_whole(req.known - hit * bs, n):
                break
            first_layer_s = -1.0
            if load and self.overlap == "layerwise":  # estimated on the links before it starts
                first_layer_s = now + kv.first_layer_s(load)
            waiting.popleft()
            first = req.cached_tokens < 0
            if first:
                req.cached_tokens = hit * bs
                req.scheduled_s = now
            done = kv.admit(req, plan, now, first)
            self.outstanding_tokens -= req.computed
            if pulling:
                assert self.handoff is not None
                req.load_started_s = now
                self.loading.append(req)
                pulled = self.handoff.pull(req, hit)
                pulled.callbacks.append(lambda _ev, req=req: self._arrived(req, -1))  # type: ignore[misc]
                continue
            if done is not None and self.overlap != "none":
                req.load_started_s = now
                n = self._start_gated(req, plan, done, first_layer_s, budget)
                running.append(req)
                if n:
                    batch.append((req, n))
                    budget -= n
                continue
            if done is not None:
                req.load_started_s = now
                self.loading.append(req)
                end = hit + len(load)
                done.callbacks.append(lambda _ev, req=req, end=end: self._arrived(req, end))  # type: ignore[misc]
                continue
            running.append(req)
            batch.append((req, n))
            budget -= n

    def _arrived(self, req: Request, end: int) -> None:
        """The blocks `req` waited for are in HBM: the tiers below loaded them up to block `end`,
        or (`end` < 0) its prompt's KV came from its prefill replica; it runs."""
        now = self.env.now
        req.load_wait_s += now - req.load_started_s
        self.loading.remove(req)
        before = req.computed
        if end < 0:  # decode it (a later preemption recomputes it locally)
            self.kv.pulled(req, now)
            req.handoff = None
        else:
            self.kv.loaded(req, end, now)
        self.outstanding_tokens -= req.computed - before
        self.running.append(req)
        self._notify()

    # -- loads that compute overlaps (kvsim.engine.gates) ------------------------------------
    def _start_gated(
        self, req: Request, plan: tuple, event: simpy.Event, first_s: float, budget: int
    ) -> int:
        """Run `req` while its load is in flight; the tokens it computes in this iteration."""
        hit, _, load, _, _ = plan
        end = hit + len(load)
        bs = self.block_size
        if self.overlap == "layerwise":  # compute the rest of the prompt, layer by layer behind
            stop = -1
            before = req.computed
            req.computed = end * bs
            self.outstanding_tokens -= req.computed - before
            n = min(req.known - req.computed, budget)
            need = _blocks_for(req.computed + n, bs) - req.table.held_blocks
            if not self.kv.allocate_slots(req, need):
                n = 0
        else:  # bidirectional: compute the front of the cached prefix while the back loads
            stop = (hit + load.count(COMPUTE)) * bs
            n = min(stop - req.computed, budget)
        gate = req.gate = LoadGate(event, end, stop, first_s)
        self.gated += 1
        event.callbacks.append(lambda _ev: self._gate_loaded(req, gate))
        return n

    def _gate_loaded(self, req: Request, gate: LoadGate) -> None:
        if gate.cancelled:
            return
        now = self.env.now
        gate.done = True
        gate.done_s = now
        req.load_wait_s += now - req.load_started_s
        if gate.stop < 0 or req.computed >= gate.stop:
            self._join(req, gate)
        self._notify()

    def _join(self, req: Request, gate: LoadGate) -> None:
        """The loaded blocks are in and the front, if any, is computed: count them computed."""
        before = req.computed
        self.kv.loaded(req, gate.end, self.env.now)
        self.outstanding_tokens -= req.computed - before
        req.gate = None
        self.gated -= 1

    def prefetch(self, req: Request) -> None:
        """Bring `req`'s blocks from lower tiers into HBM ahead of its arrival."""
        self.kv.prefetch(req, self.run_reserved_blocks, self._notify)

    def _preempt(self, req: Request) -> None:
        gate = req.gate
        if gate is not None:  # its load lands in blocks it no longer holds
            gate.cancelled = True
            req.gate = None
            self.gated -= 1
        self.kv.free(req, self.env.now)
        self.outstanding_tokens += req.computed
        req.preemptions += 1
        req.reset_kv()
        self.waiting.appendleft(req)

    # -- completing an iteration -------------------------------------------------------------------
    def _complete(self, decoders: list[Request], batch: list[tuple[Request, int]]) -> None:
        """Apply an iteration `_schedule` chose, in its order."""
        now = self.env.now
        kv = self.kv
        bs = self.block_size
        compacting = self.compacting
        finished = False
        handed: list[Request] = []
        for req in decoders:  # the general case below, for a decode step of a started output
            computed = req.computed = req.computed + 1
            # a block filled up (past its chain a commit only moves the mark: it can wait)
            if not computed % bs and computed // bs > req.table.processed_blocks:
                kv.commit(req, now)
            req.known = computed + 1
            generated = req.generated = req.generated + 1
            if generated >= req.output_tokens:
                self._finish(req, now)
                finished = True
        for req, n in batch:
            computed = req.computed = req.computed + n
            if computed // bs > req.table.processed_blocks:  # a block filled up
                kv.commit(req, now)
            gate = req.gate
            if gate is not None and gate.done and computed >= gate.stop >= 0:
                self._join(req, gate)  # bidirectional: front computed, back loaded
                computed = req.computed
            if computed != req.known or req.handoff is not None:
                self.outstanding_tokens -= n
                if computed == req.known:  # a prefill replica's work is done: hand it on
                    handed.append(req)
                continue
            if n != 1:  # a decode step's token is computed and its next one is known: no change
                self.outstanding_tokens += 1 - n
            if compacting:
                comp = req.comp
                if comp is not None and comp.drops and not req.table.compacted:
                    kv.compact(req, now)  # the prompt was scored whole: keep what is kept
            generated = req.generated = req.generated + 1
            req.known = computed + 1
            if req.first_token_s < 0:
                req.first_token_s = now
            if generated >= req.output_tokens:
                self._finish(req, now)
                finished = True
        if finished:
            self.running = [r for r in self.running if r.finish_s < 0]
        if handed:
            self._hand_off(handed)

    def _hand_off(self, handed: list[Request]) -> None:
        """The prompts of `handed` are computed: their blocks stay pinned here until the decode
        replica has pulled them; the cluster moves each request on."""
        assert self.handoff is not None
        gone = set(map(id, handed))
        self.running = [r for r in self.running if id(r) not in gone]
        for req in handed:
            table = req.table
            req.table = BlockTable()
            req.handoff = "decode"
            req.computed = 0  # on the decode replica, until its prompt KV has arrived
            self.handoff.prefilled(req, table)

    def _finish(self, req: Request, now: float) -> None:
        self.outstanding_tokens -= req.known - req.computed
        req.finish_s = now
        req.hint = req.reply_hint  # its reply is decoded: a tool call or not is known now
        self.kv.free(req, now)
        req.table.drop_chain()
        self.on_finish(req)

    # -- decode coalescing -------------------------------------------------------------------------
    def _in_round(self) -> bool:
        """Multi-step: decoding continues without the scheduler (a round is under way, or
        a new one starts because nothing waiting can join)."""
        if self.config.num_scheduler_steps == 1 or not self._all_decoding():
            return False
        return self.round_left > 0 or self._cannot_admit()

    def _all_decoding(self) -> bool:
        """Every running request decodes one token and the batch fits one iteration."""
        running = self.running
        if self.gated or not running or len(running) > self.max_num_batched_tokens:
            return False
        # one decode token each, tested in C: known - computed == 1 for every request, from the
        # back, where an admitted request still prefilling sits (the test then stops at once)
        known, computed = map(_known, reversed(running)), map(_computed, reversed(running))
        return all(map(_is_one, map(sub, known, computed)))

    def _cannot_admit(self) -> bool:
        running = self.running
        if not self.waiting or len(running) + len(self.loading) >= self.max_num_seqs:
            return True
        # the head of the queue cannot be admitted now, and decoding only takes blocks away
        budget = self.max_num_batched_tokens - len(running)
        if budget <= 0:
            return True
        req = self.waiting[0]
        kv = self.kv
        available = kv.available_blocks
        least, most, evictable = kv.admission_bounds(req, budget)
        if least + evictable + self._reservation(req, least) > available:
            return True
        if most + evictable + self._reservation(req, most) <= available:
            return False
        _, evictable, _, _, need = kv.lookup(req, budget)
        return need + evictable + self._reservation(req, need) > available

    def _blocks_needed(self, computed: BlockCounts, held: BlockCounts, steps: int) -> int:
        """Blocks `steps` more decode steps of the running requests take."""
        bs = self.block_size
        if self.compacting:
            assert isinstance(computed, np.ndarray) and isinstance(held, np.ndarray)
            return _kept_blocks_needed(self.running, computed, held, steps, bs)
        if isinstance(computed, list):  # ceil((c + steps) / bs) - h, at least 0, summed
            ends = map(floordiv, map(add, computed, repeat(steps + bs - 1)), repeat(bs))
            return sum(map(max, map(sub, ends, held), repeat(0)))
        return int(np.maximum(-(-(computed + steps) // bs) - held, 0).sum())

    def _coalescible_steps(self) -> tuple[int, int]:
        """(steps the decode batch can run unchanged: until the first finish, within free
        blocks; the blocks those steps take)."""
        running = self.running
        steps = min(map(sub, map(_output_tokens, running), map(_generated, running)))
        steps = min(steps, MAX_COALESCED_STEPS)
        computed, held = _block_counts(running, len(running) <= SMALL_BATCH and not self.compacting)
        available = self.kv.available_blocks
        need = self._blocks_needed(computed, held, steps)
        if need <= available:
            return steps, need
        lo, lo_need, hi = 0, 0, steps  # largest step count whose blocks fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            need = self._blocks_needed(computed, held, mid)
            if need <= available:
                lo, lo_need = mid, need
            else:
                hi = mid - 1
        return lo, lo_need

    def _decode_run(self, steps: int, need: int):
        env = self.env
        running = list(self.running)  # the batch of this run; a load may append to the list
        ends = self.pricer.run_ends_s(running, steps)
        run_s = float(ends[-1])
        self.run_reserved_blocks = need
        start = env.now
        self._release_next_round()
        self.in_flight = True
        if self.round_left:  # a multi-step round: nothing cuts it
            yield env.timeout(run_s)
            cut = False
        else:
            # the run's end or a wake, whichever comes first, resumes it; each relays through
            # `over`, one event later, as simpy's AnyOf would, without its bookkeeping
            over = env.event()
            wake = self._wake = env.event()
            wake.callbacks.append(partial(_relay, over))
            env.timeout(run_s).callbacks.append(partial(_relay, over))
            yield over
            cut = wake.triggered and env.now - start < run_s
            self._wake = None
        done = steps
        release = False  # whether the step that held arrivals waited out has run
        if cut:
            elapsed = env.now - start
            step = int(ends.searchsorted(elapsed, side="left"))
            # the step in progress ends the run; an engine that schedules ahead had already
            # chosen the one after it, which runs too before a held arrival can join
            ahead = 2 if self.next_round else 1
            done = min(step + ahead, steps)
            release = ahead == 2 and done == step + 2
            remaining = float(ends[done - 1]) - elapsed
            if remaining > 0:
                yield env.timeout(remaining)
        self.in_flight = False
        if not cut and self.round_left:  # a multi-step round looks at its queue at its end
            self._release_next_round()
        elif release:  # those in before the run's last step began; the rest wait one more
            self._release_next_round(start + float(ends[done - 2]))
        self.run_reserved_blocks = 0
        self.round_left = max(0, self.round_left - done)
        duration = float(ends[done - 1])
        self.busy_s += duration
        self.iterations += done
        self.coalesced_steps += done
        self._advance_decode(running, done, first_step_end_s=start + float(ends[0]))

    def _advance_decode(self, batch: list[Request], steps: int, first_step_end_s: float) -> None:
        """Apply `steps` decode steps to the requests that ran them (a request that joined the
        running list during the run, e.g. when its load finished, did not)."""
        now = self.env.now
        kv = self.kv
        bs = self.block_size
        finished = False
        kv.hold_writes()
        for req in batch:
            if req.table.compacted:
                t = req.computed + steps
                need = req.comp.kept_blocks(t, t - req.input_tokens) - req.table.held_blocks  # type: ignore[union-attr]
            else:
                need = -(-(req.computed + steps) // bs) - req.table.held_blocks
            if need > 0:
                ok = kv.allocate_slots(req, need)
                assert ok, "coalesced decode ran out of blocks it had counted"
            if req.generated == 0:  # its last prompt token went in the first step
                req.first_token_s = first_step_end_s
            req.computed += steps
            req.generated += steps
            req.known += steps
            if req.computed // bs > req.table.processed_blocks:  # a block filled up
                kv.commit(req, now)
            comp = req.comp
            if self.compacting and comp is not None and comp.drops and not req.table.compacted:
                kv.compact(req, now)  # its last prompt token went in the first step
            if req.generated >= req.output_tokens:
                self._finish(req, now)
                finished = True
        kv.release_writes()
        if finished:
            self.running = [r for r in self.running if r.finish_s < 0]

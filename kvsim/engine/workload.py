"""The trace's requests arriving at the serving system: the workload side of a run.

Open-loop requests arrive at their trace times. A closed-loop turn (the trace gives its think
time) arrives that long after the turn it follows finishes, and its session's blocks are
prefetched towards the replica that served it `prefetch_lead_s` before it is due. A request that
can never be served is refused at once: beyond the model's context (vLLM refuses a prompt beyond
``max_model_len``) or needing more KV blocks than a replica has at its peak. Under auto
compression the chooser picks each request's profile as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import numpy as np
import simpy

from kvsim.engine.resolve import ResolvedEngine
from kvsim.engine.trace_view import TraceRequests
from kvsim.kvcache.request import Request
from kvsim.metrics.requests import RequestLog

if TYPE_CHECKING:
    from kvsim.engine.assemble import Fleet
    from kvsim.engine.scheduler import Scheduler
    from kvsim.metrics.timeline import Timeline

ProgressFn = Callable[[int, int], None]


class Workload:
    """Issues the trace's requests, records each as it finishes, and issues the turns that
    follow. Built before the replicas (they report finished requests to `finished`) and
    started once the fleet that serves them exists (`start`)."""

    def __init__(
        self,
        env: simpy.Environment,
        source: TraceRequests,
        run: ResolvedEngine,
        log: RequestLog,
        progress: ProgressFn | None = None,
        timed: np.ndarray | None = None,
    ) -> None:
        """`timed`: the rows this engine issues (a sharded window's, kvsim.engine.window; None:
        every row). A closed-loop turn whose earlier turn is not timed arrives at its trace time."""
        self.env = env
        self.source = source
        self.run = run
        self.log = log
        self.progress = progress
        self.completed = 0
        self.live: dict[int, Request] = {}  # issued or about to be, not yet recorded
        # per row, the closed-loop turn that follows it (-1: none), a word a request
        self.every_follow = source.next_turns()  # with the turns a warm-up replays
        self.follows = self.every_follow  # those this engine issues when their turn finishes
        self.timed = timed
        self.total = source.n
        if timed is not None:
            self.total = int(timed.sum())
            # a turn whose earlier one is only replayed arrives at its trace time
            untimed = np.flatnonzero((self.follows >= 0) & ~timed)
            source.closed_loop[self.follows[untimed]] = False
            self.follows = self.follows.copy()
            self.follows[untimed] = -1
        self.comp_codes = np.zeros(source.n, dtype=np.int16)  # index into the fleet's engines
        self.kv_peak_blocks = np.zeros(source.n, dtype=np.int64)
        self._fleet: Fleet | None = None
        self._timeline: Timeline | None = None

    @property
    def done(self) -> bool:
        return self.completed >= self.total

    def start(self, fleet: Fleet, timeline: Timeline, from_s: float = 0.0) -> None:
        """Begin the arrivals into `fleet`; `timeline` samples the run from `from_s` (a sharded
        window's timed start) until it is done."""
        self._fleet = fleet
        self._timeline = timeline
        env = self.env
        env.process(self._arrivals())
        env.process(self._sample(timeline, from_s))
        if fleet.view.stale:
            env.process(self._refreshes(fleet))

    def _sample(self, timeline: Timeline, from_s: float) -> Generator[simpy.Event, object, None]:
        if from_s > self.env.now:
            yield self.env.timeout(from_s - self.env.now)
        yield from timeline.sample(lambda: self.done)

    def finished(self, req: Request) -> None:
        """`req` left the system (served or refused): record it; issue the turn that follows."""
        self.completed += 1
        self._record(req)
        del self.live[req.index]
        if self.progress is not None:
            self.progress(self.completed, self.total)
        nxt = int(self.follows[req.index])
        if nxt < 0:
            return
        env, config = self.env, self.run.config
        think = float(self.source.think_time_s[nxt])
        turn = self.request(nxt)
        env.timeout(think).callbacks.append(lambda _ev: self._issue(turn))
        assert self._fleet is not None
        replica = self._fleet.replicas[req.replica]
        if replica.kv.hierarchy and config.prefetch:
            # the session will continue: bring its blocks up before the next turn is due
            # (towards the replica that served it, where a session-aware router sends it)
            prefetch_after(env, max(think - config.prefetch_lead_s, 0.0), replica, turn)

    def unfinished(self) -> None:
        """Record the requests still in the system when the run ended."""
        for req in self.live.values():
            self._record(req)

    def _record(self, req: Request) -> None:
        self.log.record(req)
        self.kv_peak_blocks[req.index] = req.kv_peak_blocks
        if req.comp is not None:
            self.comp_codes[req.index] = req.comp.code

    def request(self, i: int) -> Request:
        """Request `i`, in the system from now until it is recorded."""
        req = self.live[i] = self.new_request(i)
        return req

    def new_request(self, i: int) -> Request:
        """Request `i` as the trace gives it (a warm-up's, which never enters the system)."""
        source = self.source
        req = Request(i, int(source.input_tokens[i]), int(source.output_tokens[i]))
        req.hint = source.hints.at(i, replied=False)
        req.reply_hint = source.hints.at(i)
        assert self._fleet is not None
        req.comp = self._fleet.run_comp
        return req

    def _arrivals(self) -> Generator[simpy.Event, object, None]:
        env, source = self.env, self.source
        issued = ~source.closed_loop if self.timed is None else ~source.closed_loop & self.timed
        order = np.flatnonzero(issued)
        order = order[np.argsort(source.arrival_s[order], kind="stable")]
        for i in order.tolist():
            delay = float(source.arrival_s[i]) - env.now
            if delay > 0:
                yield env.timeout(delay)
            self._issue(self.request(i))

    def _refreshes(self, fleet: Fleet) -> Generator[simpy.Event, object, None]:
        """New snapshots for routers every `router_refresh_s` while requests remain."""
        interval = self.run.config.router_refresh_s
        while not self.done:
            yield self.env.timeout(interval)
            fleet.view.refresh()

    def _issue(self, req: Request) -> None:
        fleet, timeline = self._fleet, self._timeline
        assert fleet is not None and timeline is not None
        timeline.wake()
        if fleet.chooser is not None:
            req.comp = fleet.chooser.choose(req)
        if self.never_fits(req):
            # like a prompt beyond max_model_len: it can never fit, so it is refused at once
            self.log.rejected[req.index] = True
            req.arrival_s = self.env.now
            req.finish_s = self.env.now
            self.finished(req)
            return
        fleet.cluster.route(req)

    def never_fits(self, req: Request) -> bool:
        """Beyond the model's context, or more blocks than a replica has at its peak."""
        run = self.run
        total = req.input_tokens + req.output_tokens
        context = run.model.max_context_tokens
        if context is not None and total > context:
            return True
        block_size = run.config.block_size
        c = req.comp
        if c is None or not c.drops:
            reserved = c.reserved_blocks(total) if c is not None else 0
            return total > (run.num_blocks - reserved) * block_size
        prompt = -(-req.input_tokens // block_size)
        return max(prompt, c.kept_blocks(total, req.output_tokens)) > run.num_blocks


def prefetch_after(
    env: simpy.Environment, lead_s: float, replica: Scheduler, turn: Request
) -> None:
    """In `lead_s`, start bringing `turn`'s blocks towards `replica`'s HBM: a session's next
    turn, while the session thinks (the timed engine's and the warm-up's)."""
    env.timeout(lead_s).callbacks.append(lambda _ev: replica.prefetch(turn))

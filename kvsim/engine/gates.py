"""Loads from lower tiers that a running request's compute overlaps (`load_overlap`).

The overlap itself is costed by kvsim.kvcache.overlap when the manager plans a load; here is
what the scheduler keeps while such a load is in flight. A request admitted with an overlapped
load runs behind a `LoadGate`:

- layerwise: it computes the rest of its prompt while its cached prefix loads layer by layer; an
  iteration holding it ends no sooner than its first layer's KV plus the iteration, nor than the
  last byte plus one layer of the iteration, so iteration and load end together at
  max(A/L + C, A + C/L) (`gated_iteration`).
- bidirectional: it computes the front of its cached prefix (up to the gate's `stop`) while the
  back loads, and jumps to the end of the loaded blocks once both are done.
"""

from __future__ import annotations

from collections.abc import Generator

import simpy

from kvsim.kvcache.request import Request


class LoadGate:
    """A load from lower tiers that a running request's compute overlaps (--load-overlap)."""

    __slots__ = ("cancelled", "done", "done_s", "end", "event", "first_s", "stop")

    def __init__(self, event: simpy.Event, end: int, stop: int, first_s: float) -> None:
        self.event = event  # fires when the last loaded block is in HBM
        self.end = end  # the block after the loaded ones
        self.stop = stop  # bidirectional: compute may not pass this token before the join; -1
        self.first_s = first_s  # layerwise: when the first layer's KV is in (an estimate)
        self.done = False
        self.done_s = 0.0
        self.cancelled = False  # the request was preempted: its load no longer concerns it


def gated_iteration(
    env: simpy.Environment, batch: list[tuple[Request, int]], duration: float, layers: int
) -> Generator[simpy.Event, None, None]:
    """Run one iteration of `duration` whose batch may hold layer-wise loading requests: it ends
    no sooner than each one's first layer plus `duration`, nor than its last byte plus one of
    the model's `layers`."""
    gates = [r.gate for r, _ in batch if r.gate is not None and r.gate.stop < 0]
    start = env.now
    end = start + duration
    for gate in gates:
        end = max(end, gate.first_s + duration)
    yield env.timeout(end - start)
    pending = [g.event for g in gates if not g.done]
    if pending:
        yield simpy.AllOf(env, pending)
    if gates:
        tail = max(g.done_s for g in gates) + duration / layers
        if tail > env.now:
            yield env.timeout(tail - env.now)

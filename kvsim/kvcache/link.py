"""A data path between HBM and a memory tier, shared by every transfer on it.

Concurrent transfers share the link's time equally (processor sharing), the usual model of a
PCIe, CXL, NVMe or NIC path carrying several DMA streams; Dynamo's KVBM mock engine models its
G1-G2-G3 links the same way (reference/algorithms.md). A transfer first waits the access latency,
then needs `bytes / bandwidth` seconds of the link to itself; with k such transfers in flight each
progresses at 1/k of the rate.

Reads (loads into HBM, on a request's critical path) and writes (write-backs, background work) use
the same link time, but a write makes progress only while no read is in flight: write-backs wait
for loads, and never stretch a load the engine chose because it was faster than recomputing.
(Our assumption: offloading connectors issue write-backs on a separate, lower-priority stream.)

The link is event-driven: only starts and completions create SimPy events, never bytes or ticks.
A completion timer is set for the transfer with the least work left, and when it fires that
transfer is done, whatever rounding left in its `remaining_s`: at a large simulated time the clock
cannot add the last picoseconds, so a threshold on what is left could stall the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import simpy


@dataclass(slots=True)
class LinkStats:
    """What a link measured: bytes each way, time busy, and delay caused by sharing."""

    bytes_read: int = 0  # towards HBM
    bytes_written: int = 0  # away from HBM
    transfers: int = 0
    busy_s: float = 0.0
    queueing_s: float = 0.0  # summed over transfers: actual duration - duration alone


_TIE_S = 1e-12  # transfers within this much work of the completing one finish with it
_REMAINING = attrgetter("remaining_s")


class _Transfer:
    __slots__ = ("done", "remaining_s", "solo_s", "started_s", "write")

    def __init__(self, done: simpy.Event, work_s: float, started_s: float, write: bool) -> None:
        self.done = done
        self.remaining_s = work_s
        self.solo_s = work_s
        self.started_s = started_s
        self.write = write


class Link:
    """A processor-sharing link with a latency and a read and a write bandwidth."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        read_bytes_per_s: float,
        write_bytes_per_s: float,
        latency_s: float,
    ) -> None:
        if read_bytes_per_s <= 0 or write_bytes_per_s <= 0:
            raise ValueError(f"link {name}: bandwidth must be positive")
        self.env = env
        self.name = name
        self.read_bytes_per_s = read_bytes_per_s
        self.write_bytes_per_s = write_bytes_per_s
        self.latency_s = latency_s
        self.stats = LinkStats()
        self._reads: list[_Transfer] = []
        self._writes: list[_Transfer] = []
        self._last_s = 0.0  # when `remaining_s` of the active transfers was last brought up to date
        self._generation = 0  # invalidates completion timers scheduled before the last change
        self._next: _Transfer | None = None  # the transfer the pending timer completes
        self._active = 0  # transfers started and not finished

    def transfer(self, nbytes: int, write: bool = False) -> simpy.Event:
        """Start moving `nbytes` (a read towards HBM, or a write away from it); the returned
        event fires when the last byte has arrived."""
        done = self.env.event()
        rate = self.write_bytes_per_s if write else self.read_bytes_per_s
        if write:
            self.stats.bytes_written += nbytes
        else:
            self.stats.bytes_read += nbytes
        self.stats.transfers += 1
        self._active += 1
        work_s = nbytes / rate
        if self.latency_s > 0:
            self.env.timeout(self.latency_s).callbacks.append(
                lambda _ev: self._join(done, work_s, write)
            )
        else:
            self._join(done, work_s, write)
        return done

    # -- processor sharing -----------------------------------------------------------------------
    def _served(self) -> list[_Transfer]:
        """The transfers progressing now: the reads, or the writes when no read is in flight."""
        return self._reads or self._writes

    def _advance(self) -> None:
        now = self.env.now
        served = self._served()
        if served:
            elapsed = now - self._last_s
            self.stats.busy_s += elapsed
            share = elapsed / len(served)
            for t in served:
                t.remaining_s -= share
        self._last_s = now

    def _join(self, done: simpy.Event, work_s: float, write: bool) -> None:
        self._advance()
        transfer = _Transfer(done, work_s, self.env.now, write)
        (self._writes if write else self._reads).append(transfer)
        self._schedule()

    def _schedule(self) -> None:
        self._generation += 1
        served = self._served()
        if not served:
            return
        generation = self._generation
        self._next = first = min(served, key=_REMAINING)
        delay = max(first.remaining_s, 0.0) * len(served)
        self.env.timeout(delay).callbacks.append(lambda _ev: self._complete(generation))

    def _complete(self, generation: int) -> None:
        if generation != self._generation:
            return  # the set of transfers changed since this timer was set
        self._advance()
        now = self.env.now
        served = self._served()
        # the timer's own transfer is done; so is any tied with it (equal work left)
        timed = self._next
        assert timed is not None
        done_below = max(timed.remaining_s, 0.0) + _TIE_S
        finished: list[_Transfer] = []
        left: list[_Transfer] = []
        for t in served:
            (finished if t is timed or t.remaining_s <= done_below else left).append(t)
        if served is self._reads:
            self._reads = left
        else:
            self._writes = left
        self._active -= len(finished)
        for t in finished:
            self.stats.queueing_s += max(0.0, (now - t.started_s) - t.solo_s)
            t.done.succeed()
        self._schedule()

    @property
    def idle(self) -> bool:
        """No transfer started and not yet finished (in its latency or moving bytes)."""
        return self._active == 0

    @property
    def reads_in_flight(self) -> int:
        """Loads sharing the link now (write-backs yield to them, so they do not count)."""
        return len(self._reads)

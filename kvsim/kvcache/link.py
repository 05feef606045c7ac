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

Each call to `transfer` may be several DMA copies (`pieces`: one per block when blocks are
contiguous, one per block and layer when a block is split by layer). A copy has a fixed cost on
top of its bytes, so a transfer needs `pieces * overhead_s + bytes / bandwidth` seconds of the
link: measured DMA throughput grows with the copy size the same way (about 2 GB/s at 8 KiB,
39 GB/s at 512 KiB, 48 GB/s at 2 MiB on an H100's PCIe Gen5 link; vLLM's KV offloading post,
blog.vllm.ai 2026-01-08, Fig. 4), and a layer-split layout pays for it.

A link may also cap what one source (a replica's GPUs) can draw: a node's NVMe drives shared by
the replicas on the node, each behind its own PCIe links. The link then serves at
`min(bandwidth, sources reading * cap)`, shared equally by the transfers in flight, so one replica
reading alone gets up to its own link's limit or the drives', whichever is lower.

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

    # bytes as given: whole bytes from the hierarchy, fractions from the fluid model's users
    # (int | float keeps an int an int where the module is compiled; kvsim.compiled)
    bytes_read: int | float = 0  # towards HBM
    bytes_written: int | float = 0  # away from HBM
    transfers: int = 0
    busy_s: float = 0.0
    queueing_s: float = 0.0  # summed over transfers: actual duration - duration alone


_TIE_S = 1e-12  # transfers within this much work of the completing one finish with it
_REMAINING = attrgetter("remaining_s")


class _Transfer:
    __slots__ = ("done", "remaining_s", "solo_s", "source", "started_s", "write")

    def __init__(
        self, done: simpy.Event, work_s: float, started_s: float, write: bool, source: int
    ) -> None:
        self.done = done
        self.remaining_s = work_s
        self.solo_s = work_s
        self.started_s = started_s
        self.write = write
        self.source = source


class Link:
    """A processor-sharing link with a latency, a read and a write bandwidth, a fixed cost per
    DMA copy and, optionally, a cap on what one source may draw."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        read_bytes_per_s: float,
        write_bytes_per_s: float,
        latency_s: float,
        overhead_s: float = 0.0,
        source_cap_bytes_per_s: float | None = None,
    ) -> None:
        if read_bytes_per_s <= 0 or write_bytes_per_s <= 0:
            raise ValueError(f"link {name}: bandwidth must be positive")
        if source_cap_bytes_per_s is not None and source_cap_bytes_per_s <= 0:
            raise ValueError(f"link {name}: a source cap must be positive")
        self.env = env
        self.name = name
        self.read_bytes_per_s = read_bytes_per_s
        self.write_bytes_per_s = write_bytes_per_s
        self.latency_s = latency_s
        self.overhead_s = overhead_s
        self.source_cap_bytes_per_s = source_cap_bytes_per_s
        # sources with transfers in flight, reads and writes apart (only with a source cap)
        self._sources: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self.stats = LinkStats()
        self._reads: list[_Transfer] = []
        self._writes: list[_Transfer] = []
        self._last_s = 0.0  # when `remaining_s` of the active transfers was last brought up to date
        self._generation = 0  # invalidates completion timers scheduled before the last change
        self._next: _Transfer | None = None  # the transfer the pending timer completes
        self._active = 0  # transfers started and not finished

    def transfer(
        self, nbytes: int | float, write: bool = False, pieces: int = 1, source: int = 0
    ) -> simpy.Event:
        """Start moving `nbytes` (a read towards HBM, or a write away from it) as `pieces` DMA
        copies for `source`; the returned event fires when the last byte has arrived."""
        done = self.env.event()
        rate = self.write_bytes_per_s if write else self.read_bytes_per_s
        if write:
            self.stats.bytes_written += nbytes
        else:
            self.stats.bytes_read += nbytes
        self.stats.transfers += 1
        self._active += 1
        work_s = nbytes / rate
        if self.overhead_s > 0:
            work_s += pieces * self.overhead_s
        if self.latency_s > 0:
            self.env.timeout(self.latency_s).callbacks.append(
                lambda _ev: self._join(done, work_s, write, source)
            )
        else:
            self._join(done, work_s, write, source)
        return done

    def work_s(self, nbytes: int | float, pieces: int = 1, write: bool = False) -> float:
        """Seconds of the link alone that `nbytes` in `pieces` copies need (no latency)."""
        work = nbytes / (self.write_bytes_per_s if write else self.read_bytes_per_s)
        if self.overhead_s > 0:
            work += pieces * self.overhead_s
        return work

    def read_slowdown(self, source: int = 0) -> float:
        """How much longer than alone a new read from `source` would take on the link as it is
        loaded now: the reads in flight plus it share the link's rate equally."""
        k = len(self._reads) + 1
        if self.source_cap_bytes_per_s is None:
            return float(k)
        sources = self._sources[0]
        active = len(sources) + (source not in sources)
        return k / self._rate_share(active, self.read_bytes_per_s)

    # -- processor sharing -----------------------------------------------------------------------
    def _served(self) -> list[_Transfer]:
        """The transfers progressing now: the reads, or the writes when no read is in flight."""
        return self._reads or self._writes

    def _rate_share(self, sources: int, bandwidth: float) -> float:
        """The fraction of `bandwidth` the link serves at with `sources` drawing from it."""
        cap = self.source_cap_bytes_per_s
        assert cap is not None
        return min(1.0, sources * cap / bandwidth)

    def _speed(self, served: list[_Transfer]) -> float:
        """The served transfers' rate as a fraction of the link's bandwidth that way (1 unless
        too few sources are reading to fill it)."""
        if self.source_cap_bytes_per_s is None:
            return 1.0
        if served is self._reads:
            return self._rate_share(len(self._sources[0]), self.read_bytes_per_s)
        return self._rate_share(len(self._sources[1]), self.write_bytes_per_s)

    def _advance(self) -> None:
        now = self.env.now
        served = self._served()
        if served:
            elapsed = now - self._last_s
            self.stats.busy_s += elapsed
            if self.source_cap_bytes_per_s is None:
                share = elapsed / len(served)
            else:
                share = elapsed * self._speed(served) / len(served)
            for t in served:
                t.remaining_s -= share
        self._last_s = now

    def _join(self, done: simpy.Event, work_s: float, write: bool, source: int = 0) -> None:
        self._advance()
        transfer = _Transfer(done, work_s, self.env.now, write, source)
        (self._writes if write else self._reads).append(transfer)
        if self.source_cap_bytes_per_s is not None:
            counts = self._sources[write]
            counts[source] = counts.get(source, 0) + 1
        self._schedule()

    def _schedule(self) -> None:
        self._generation += 1
        served = self._served()
        if not served:
            return
        generation = self._generation
        self._next = first = min(served, key=_REMAINING)
        delay = max(first.remaining_s, 0.0) * len(served)
        if self.source_cap_bytes_per_s is not None:
            delay /= self._speed(served)
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
        if self.source_cap_bytes_per_s is not None:
            for t in finished:
                counts = self._sources[t.write]
                left_of_source = counts[t.source] - 1
                if left_of_source:
                    counts[t.source] = left_of_source
                else:
                    del counts[t.source]
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

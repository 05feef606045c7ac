"""TTL pinning: hold a session's blocks for a while after its request ends if it will be back.

After Continuum (Li et al., arXiv 2511.02230, 2025, "Continuum: efficient and robust multi-turn
LLM agent scheduling with KV cache time-to-live"; shared/reference/predictive-policies.md): when a
request ends in a tool call, its KV stays in GPU memory for a time-to-live chosen by a cost-benefit
model (what a reload costs against the memory the pin holds, over the distribution of tool-call
durations), and is released to the ordinary eviction order when the TTL runs out.

Here every request's release is a candidate, from its `RequestHint`: a pending tool call
(``tool_wait_s >= 0``) or an expected next turn. Releases are classed by (category, tool call /
first turn / later turn); each class learns online, from the trace's past only, the chance that
the session sends another request (``pi``) and the distribution of the gap from a release to that
request (a histogram in half-octave bins). A release its session has not followed within
``end_gaps`` mean gaps counts as the session's end. Both are shrunk towards a prior of
``prior_weight`` pseudo-releases: continuation ``prior_continue``, gap ``tool_wait_s`` when the
hint gives one (a tool call comes back in about that long), else ``prior_mean_gap_s``.

The TTL rule (our simplification of Continuum's cost-benefit model, per block and in hits): a
pin of length T holds a block until its session is back or T runs out, so it earns
r(T) = pi P(gap <= T) / (pi E[min(gap, T)] + (1 - pi) T) hits per block-second held. The TTL is
the T (a bin edge up to ``end_gaps`` mean gaps) with the highest r. The cost side: LRU would
hold the block for about the tier's fill time F (the time its last ``capacity`` released blocks
took to arrive, Che's characteristic time), earning r(F); and the blocks a pin displaces, the
older half of the LRU order, have earned ``kappa`` hits per block-second so far. A release is
pinned, for TTL > F, only when r(TTL) > (1 + ``min_gain``) max(r(F), kappa) and its session
comes back at least ``min_continue`` of the time. So pins pay only
where the gaps are not memoryless (for an exponential gap r falls with T, and LRU's short hold
is as good), the tier is too small to keep a session until it returns, and the pin out-earns
what it displaces. Continuum prices reload and queueing delay in seconds; a hit ratio weighs
every block alike.

Order: unpinned blocks and pins past their TTL first, earliest first by last use or deadline (an
expired pin rejoins the LRU order as if used when its TTL ran out), so without pins this is LRU,
deepest block first among those released together; then live pins, the latest deadline first:
the pins held longest are kept, as Continuum keeps a pin to its TTL (an engine can keep them all
only by refusing requests). Without hints (``hint`` None, or no session and no tool call)
nothing is pinned and the order is exactly LRU's.

Cost: O(log n) per add, hit and victim (two heaps with lazy deletion); O(bins) per request to
choose its TTL. Does not respect the prefix tree by construction; the engine never counts a hit
past a missing parent.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, EvictionPolicy, RequestHint, check_param

KINDS = ("tool", "first", "later")


@dataclass(frozen=True)
class TtlPinParams:
    prior_continue: float = 0.5
    """P(the session sends another request) before any evidence: no opinion (our assumption)."""
    prior_mean_gap_s: float = 60.0
    """Gap from a release to the session's next request before any evidence, when the hint
    gives no tool wait (ATC'25: most reuses come within minutes in the to-C trace)."""
    prior_weight: float = 4.0
    """Pseudo-releases of the prior in each class's estimates (our assumption)."""
    end_gaps: float = 4.0
    """A release not followed within this many mean gaps ends its session (exponential: it
    would still come back with chance e^-4, 2 %); also the longest TTL."""
    min_gain: float = 0.25
    """A pin must earn this much more per block-second than what it replaces: a guard
    against pins decided on noise (our choice: of 0.1 and 0.25, tried on sharegpt and lmsys,
    0.25 gained more at their smallest sizes; neither fell below LRU)."""
    min_continue: float = 0.1
    """A release whose session sends another request less often than this is never pinned
    (our choice): without sessions (every Mooncake request is its own) the learned chance is
    about 0.001, and pins held for nothing still outranked LRU's blocks once those earned nothing
    either, a stable set that helped one trace by accident and hurt another."""
    gap_base_s: float = 0.25
    """Upper edge of the first gap bin; each next edge is sqrt(2) times the last."""
    gap_bins: int = 64
    """Gap bins (64 from 0.25 s reach 1.1e9 s)."""

    def __post_init__(self) -> None:
        check_param(0 <= self.prior_continue <= 1, "prior_continue", "must be in [0, 1]")
        check_param(0 <= self.min_gain <= 1e9, "min_gain", "must be in [0, 1e9]")
        check_param(0 <= self.min_continue <= 1, "min_continue", "must be in [0, 1]")
        for name in ("prior_mean_gap_s", "prior_weight", "end_gaps", "gap_base_s"):
            check_param(0 < getattr(self, name) <= 1e9, name, "must be in (0, 1e9]")
        check_param(1 <= self.gap_bins <= 256, "gap_bins", "must be an integer in [1, 256]")


class _Release:
    """What one class of releases has taught: continued, ended, and the continued ones' gaps
    (count and summed gap per bin)."""

    __slots__ = ("continued", "counts", "ended", "gap_sum", "sums")

    def __init__(self, bins: int) -> None:
        self.continued = 0
        self.ended = 0
        self.gap_sum = 0.0
        self.counts = [0.0] * bins
        self.sums = [0.0] * bins


class TtlPin(EvictionPolicy):
    name = "ttl-pin"
    Params = TtlPinParams

    def __init__(self, params: TtlPinParams | None = None) -> None:
        self.params = p = params or TtlPinParams()
        self._edges = [p.gap_base_s * 2.0 ** (b / 2) for b in range(p.gap_bins)]
        self._empty = _Release(p.gap_bins)
        self._classes: dict[tuple[str, int], _Release] = {}
        self._open: dict[int, tuple[float, tuple[str, int]]] = {}  # session -> (release, class)
        self._waits: deque[tuple[float, int]] = deque()  # (release, session), oldest first
        self._arrived: RequestHint | None = None  # the request last seen arriving
        self._released: RequestHint | None = None  # the request whose blocks are being added
        self._ttl = 0.0  # pin of that request's blocks (0: none)
        # evictable blocks: order stamp and deadline (= last use + TTL; last use when unpinned)
        self._stamp: dict[int, int] = {}
        self._deadline: dict[int, float] = {}
        self._order: list[tuple[float, int, int]] = []  # (deadline, stamp, key): earliest first
        self._pins: list[tuple[float, int, int]] = []  # (-deadline, stamp, key), pinned only
        self._clock = 0
        self._now = 0.0
        self._capacity = 1
        self._adds = 0
        self._hits = 0
        self._start = math.nan
        self._marks: deque[tuple[int, float]] = deque()  # (blocks released so far, at time)

    # -- learning ---------------------------------------------------------------------------------
    def set_capacity(self, blocks: int) -> None:
        self._capacity = max(1, blocks)

    @staticmethod
    def _class_of(hint: RequestHint) -> tuple[str, int]:
        kind = 0 if hint.tool_wait_s >= 0 else 1 if hint.turn == 0 else 2
        return hint.category, kind

    def _stats(self, hint: RequestHint) -> _Release:
        return self._classes.get(self._class_of(hint)) or self._empty

    def _prior_gap(self, hint: RequestHint) -> float:
        return hint.tool_wait_s if hint.tool_wait_s > 0 else self.params.prior_mean_gap_s

    def estimate(self, hint: RequestHint) -> tuple[float, float]:
        """(P(the session sends another request), mean gap to it in s) for a release of this
        request, from its class's past and the prior."""
        p = self.params
        stats = self._stats(hint)
        w = p.prior_weight
        pi = (stats.continued + w * p.prior_continue) / (stats.continued + stats.ended + w)
        return pi, (stats.gap_sum + w * self._prior_gap(hint)) / (stats.continued + w)

    def mean_gap(self) -> float:
        """Mean gap from a release to the session's next request, all classes pooled."""
        p = self.params
        continued = sum(c.continued for c in self._classes.values())
        gaps = sum(c.gap_sum for c in self._classes.values())
        return (gaps + p.prior_weight * p.prior_mean_gap_s) / (continued + p.prior_weight)

    def fill_time(self) -> float:
        """Seconds the tier took to receive its last ``capacity`` released blocks: about how
        long LRU keeps a block now (Che's characteristic time; re-releases of hit blocks count,
        so it errs short). inf until that many were released."""
        marks, boundary = self._marks, self._adds - self._capacity
        while len(marks) > 1 and marks[1][0] <= boundary:
            marks.popleft()
        return self._now - marks[0][1] if marks and marks[0][0] <= boundary else math.inf

    def kappa(self) -> float:
        """What a block in the older half of the LRU order has earned so far, in hits per
        block-second: the blocks a pin displaces (the marginal, not the average, block)."""
        elapsed = self._now - self._start
        return 2 * self._hits / (self._capacity * elapsed) if elapsed > 0 else 0.0

    def _bin(self, gap: float) -> int:
        b = math.ceil(2 * math.log2(gap / self.params.gap_base_s)) if gap > 0 else 0
        return min(max(b, 0), self.params.gap_bins - 1)

    def hold_rates(self, hint: RequestHint, holds: list[float]) -> list[float]:
        """r(T) for each T in ``holds``: hits per block-second of a pin of length T, from the
        class's gap histogram and the prior (gaps spread evenly within a bin)."""
        p = self.params
        stats = self._stats(hint)
        pi = self.estimate(hint)[0]
        w = p.prior_weight
        total = stats.continued + w
        prior_gap = self._prior_gap(hint)
        edges = self._edges
        out = []
        for hold in holds:
            b = self._bin(hold)
            low = edges[b - 1] if b else 0.0
            share = min(1.0, (hold - low) / (edges[b] - low))
            done = sum(stats.counts[:b]) + share * stats.counts[b]
            part = share * (low + hold) / (low + edges[b])  # of the bin's summed gaps
            summed = sum(stats.sums[:b]) + part * stats.sums[b]
            if prior_gap <= hold:
                done, summed = done + w, summed + w * prior_gap
            back = done / total  # P(gap <= T)
            held = (summed + hold * (total - done)) / total  # E[min(gap, T)]
            cost = pi * held + (1 - pi) * hold
            out.append(pi * back / cost if cost > 0 else 0.0)
        return out

    def ttl(self, hint: RequestHint) -> float:
        """How long a release of this request is pinned (0: not at all)."""
        if hint.session < 0 and hint.tool_wait_s < 0:
            return 0.0
        fill = self.fill_time()
        if fill == math.inf:
            return 0.0  # nothing is evicted yet
        pi, mean_gap = self.estimate(hint)
        if pi < self.params.min_continue:
            return 0.0
        longest = self.params.end_gaps * mean_gap
        holds = [e for e in self._edges if fill < e <= longest]
        if not holds:
            return 0.0
        rates = self.hold_rates(hint, [fill, *holds])
        best = max(range(1, len(rates)), key=rates.__getitem__)
        bar = (1 + self.params.min_gain) * max(rates[0], self.kappa())
        return holds[best - 1] if rates[best] > bar else 0.0

    def _tick(self, now: float) -> None:
        self._now = now
        if self._start != self._start:  # nan: the first call
            self._start = now
        waits, open_ = self._waits, self._open
        if waits:  # sessions silent for end_gaps mean gaps (all classes pooled) have ended
            oldest = now - self.params.end_gaps * self.mean_gap()
            while waits and waits[0][0] < oldest:
                released, session = waits.popleft()
                record = open_.get(session)
                if record is not None and record[0] == released:
                    del open_[session]
                    self._classes[record[1]].ended += 1

    def _arrive(self, hint: RequestHint | None) -> None:
        """A request touches its blocks: if it continues a released session, learn the gap."""
        if hint is None or hint is self._arrived or hint == self._arrived:
            return
        self._arrived = hint
        record = self._open.pop(hint.session, None) if hint.session >= 0 else None
        if record is not None:
            stats = self._classes[record[1]]
            gap = self._now - record[0]
            stats.continued += 1
            stats.gap_sum += gap
            b = self._bin(gap)
            stats.counts[b] += 1
            stats.sums[b] += gap

    def _release(self, hint: RequestHint | None) -> None:
        """A request's blocks are being handed back: open its session's wait, set the pin."""
        if hint is self._released or hint == self._released:
            return
        self._released = hint
        self._ttl = 0.0
        if not self._marks or self._marks[-1][0] != self._adds:
            self._marks.append((self._adds, self._now))
        if hint is None:
            return
        self._ttl = self.ttl(hint)
        if hint.session >= 0:
            cls = self._class_of(hint)
            if cls not in self._classes:
                self._classes[cls] = _Release(self.params.gap_bins)
            self._open[hint.session] = (self._now, cls)
            self._waits.append((self._now, hint.session))

    # -- interface --------------------------------------------------------------------------------
    def miss(self, key: int, info: BlockInfo) -> None:
        self._tick(info.now_s)
        self._arrive(info.hint)

    def _queue(self, key: int, deadline: float) -> None:
        self._clock += 1
        stamp = self._clock
        self._stamp[key] = stamp
        self._deadline[key] = deadline
        heapq.heappush(self._order, (deadline, stamp, key))
        if deadline > self._now:
            heapq.heappush(self._pins, (-deadline, stamp, key))
        if len(self._order) + len(self._pins) > 4 * len(self._stamp) + 4096:
            self._compact()

    def add(self, key: int, info: BlockInfo) -> None:
        self._tick(info.now_s)
        self._release(info.hint)
        self._adds += 1
        self._queue(key, info.now_s + self._ttl)

    def access(self, key: int, info: BlockInfo) -> None:
        self._tick(info.now_s)
        self._arrive(info.hint)
        if key in self._stamp and info.now_s - self._deadline[key] >= 0.5 * self.fill_time():
            self._hits += 1  # a hit in the older half of the LRU order: what a pin displaces
        if key in self._stamp:  # hit while evictable: used now, its pin kept
            self._queue(key, max(info.now_s, self._deadline[key]))

    def discard(self, key: int) -> None:
        if self._stamp.pop(key, None) is not None:
            del self._deadline[key]

    def _compact(self) -> None:
        """Drop stale heap entries in one pass: O(live) memory."""
        stamp, deadline, now = self._stamp, self._deadline, self._now
        self._order = [(deadline[k], s, k) for k, s in stamp.items()]
        self._pins = [(-deadline[k], s, k) for k, s in stamp.items() if deadline[k] > now]
        heapq.heapify(self._order)
        heapq.heapify(self._pins)

    def victim(self) -> int:
        stamp = self._stamp
        order = self._order
        while order and stamp.get(order[0][2]) != order[0][1]:
            heapq.heappop(order)
        if not order:
            raise LookupError("no evictable block")
        if order[0][0] <= self._now:
            return order[0][2]
        pins = self._pins  # every evictable block is pinned: the latest deadline first
        while stamp.get(pins[0][2]) != pins[0][1]:
            heapq.heappop(pins)
        return pins[0][2]

    def __len__(self) -> int:
        return len(self._stamp)

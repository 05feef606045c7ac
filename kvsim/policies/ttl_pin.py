"""TTL pinning: hold a session's blocks for a while after its request ends if it will be back.

After Continuum (Li et al., arXiv 2511.02230, 2025, "Continuum: efficient and robust multi-turn
LLM agent scheduling with KV cache time-to-live"; shared/reference/predictive-policies.md): when a
request ends in a tool call, its KV stays in GPU memory for a time-to-live chosen by a cost-benefit
model (what a reload costs against the memory the pin holds, over the distribution of tool-call
durations), and is released to the ordinary eviction order when the TTL runs out.

Here every request's release is a candidate, from its `RequestHint`: a pending tool call
(``tool_wait_s >= 0``) or an expected next turn. Releases are classed by (category, tool call /
first turn / later turn); each class learns online, from the trace's past only, the chance that
the session sends another request (``pi``) and the mean gap from a release to that request (an
exponential of rate ``lam``; ``tool_wait_s`` > 0 is the prior mean). A release the session has not
followed within ``end_gaps`` mean gaps counts as the session's end. Both are shrunk towards a
prior by ``prior_weight`` pseudo-releases.

The TTL rule (our simplification of Continuum's cost-benefit model, per block and in hits):
holding a block one more second is worth the session's return hazard at the block's idle age,
h(a) = lam pi e^(-lam a) / (pi e^(-lam a) + 1 - pi), and costs what a block of this tier earns in
that second, ``kappa`` = hits per block-second so far. So the TTL is the age where h falls to
kappa, a* = ln(pi (lam - kappa) / (kappa (1 - pi))) / lam, capped at ``end_gaps`` mean gaps; no pin
when lam pi <= kappa (not even a fresh block is worth its room). Continuum prices the reload and
the queueing delay in seconds; a hit ratio weighs every block alike, so we do too.

Order: unpinned blocks first, in LRU order (last use, then release order, so a request's deepest
block first); then pinned blocks, the one with the latest deadline first (it would hold its room
longest; Continuum instead never evicts a pinned block before its TTL, which an engine can do
only by refusing requests). An expired pin rejoins the LRU order at its last use. Without hints
(``hint`` None, or no session and no tool call) nothing is pinned and the order is exactly LRU's.

Cost: O(log n) per add, hit and victim (three heaps with lazy deletion), O(1) per request for
the learning. Does not respect the prefix tree by construction; the engine never counts a hit
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

    def __post_init__(self) -> None:
        check_param(0 <= self.prior_continue <= 1, "prior_continue", "must be in [0, 1]")
        for name in ("prior_mean_gap_s", "prior_weight", "end_gaps"):
            check_param(0 < getattr(self, name) <= 1e9, name, "must be in (0, 1e9]")


class _Release:
    """What one class of releases has taught: continued, ended, summed gaps of the continued."""

    __slots__ = ("continued", "ended", "gap_sum")

    def __init__(self) -> None:
        self.continued = 0
        self.ended = 0
        self.gap_sum = 0.0


class TtlPin(EvictionPolicy):
    name = "ttl-pin"
    Params = TtlPinParams

    def __init__(self, params: TtlPinParams | None = None) -> None:
        self.params = params or TtlPinParams()
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
        self._start = math.nan
        self._hits = 0
        self._capacity = 1
        self._adds = 0

    # -- learning ---------------------------------------------------------------------------------
    def set_capacity(self, blocks: int) -> None:
        self._capacity = max(1, blocks)

    @staticmethod
    def _class_of(hint: RequestHint) -> tuple[str, int]:
        kind = 0 if hint.tool_wait_s >= 0 else 1 if hint.turn == 0 else 2
        return hint.category, kind

    def estimate(self, hint: RequestHint) -> tuple[float, float]:
        """(P(the session sends another request), mean gap to it in s) for a release of this
        request, from its class's past and the prior."""
        p = self.params
        stats = self._classes.get(self._class_of(hint)) or _Release()
        w = p.prior_weight
        prior_gap = hint.tool_wait_s if hint.tool_wait_s > 0 else p.prior_mean_gap_s
        pi = (stats.continued + w * p.prior_continue) / (stats.continued + stats.ended + w)
        return pi, (stats.gap_sum + w * prior_gap) / (stats.continued + w)

    def mean_gap(self) -> float:
        """Mean gap from a release to the session's next request, all classes pooled."""
        p = self.params
        continued = sum(c.continued for c in self._classes.values())
        gaps = sum(c.gap_sum for c in self._classes.values())
        return (gaps + p.prior_weight * p.prior_mean_gap_s) / (continued + p.prior_weight)

    def kappa(self) -> float:
        """What one block of this tier has earned so far: hits per block-second."""
        elapsed = self._now - self._start
        return self._hits / (self._capacity * elapsed) if elapsed > 0 else 0.0

    def ttl(self, hint: RequestHint) -> float:
        """How long a release of this request is pinned (0: not at all)."""
        if hint.session < 0 and hint.tool_wait_s < 0:
            return 0.0
        pi, gap = self.estimate(hint)
        longest = self.params.end_gaps * gap
        rate, kappa = 1.0 / gap, self.kappa()
        if pi <= 0 or rate * pi <= kappa:
            return 0.0
        if kappa <= 0 or pi >= 1:
            return longest
        return min(longest, math.log(pi * (rate - kappa) / (kappa * (1 - pi))) / rate)

    def fill_time(self) -> float:
        """Seconds the tier takes to receive as many released blocks as it holds: about how
        long LRU keeps a block (Che's characteristic time; re-releases of hit blocks count, so
        it errs short). inf before anything was released."""
        elapsed = self._now - self._start
        return self._capacity * elapsed / self._adds if self._adds and elapsed > 0 else math.inf

    def holds_pins(self) -> bool:
        """Whether, among pinned blocks, the latest deadline goes first. True when the tier
        fills faster than a session comes back: a fresh pin would then mostly be gone before
        its session returned, and the pins already held are the ones worth their room (a
        commitment kept, as Continuum keeps a pin to its TTL). Otherwise the earliest
        deadline goes first, as LRU would."""
        continued = sum(c.continued for c in self._classes.values())
        if not continued:
            return False
        gap = sum(c.gap_sum for c in self._classes.values()) / continued
        return self.fill_time() < gap

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
            stats.continued += 1
            stats.gap_sum += self._now - record[0]

    def _release(self, hint: RequestHint | None) -> None:
        """A request's blocks are being handed back: open its session's wait, set the pin."""
        if hint is self._released or hint == self._released:
            return
        self._released = hint
        self._ttl = 0.0
        if hint is None:
            return
        self._ttl = self.ttl(hint)
        if hint.session >= 0:
            cls = self._class_of(hint)
            self._classes.setdefault(cls, _Release())
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
        self._hits += 1
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
        if order[0][0] <= self._now or not self.holds_pins():
            return order[0][2]
        pins = self._pins  # every evictable block is pinned: the latest deadline first
        while stamp.get(pins[0][2]) != pins[0][1]:
            heapq.heappop(pins)
        return pins[0][2]

    def __len__(self) -> int:
        return len(self._stamp)

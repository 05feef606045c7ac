"""Bayesian reuse predictor on request metadata: evict the block least likely to be reused before
it would be evicted anyway, weighted by what losing it costs (issue 23's redesign).

Sources: the reuse-probability ranking of "KVCache Cache in the Wild" (Wang et al., USENIX ATC'25,
arXiv 2506.02634: within a request category and turn, the reuse probability is a predictable
function of the time since last use) and the relaxed-Belady horizon of LRB (Song et al., NSDI'20:
"reused within about the cache's eviction age"). The previous design stays as ``bayes-reuse-v1``.

Classes. A block belongs to one (category, turn bucket, gap bucket) class, set from the
`RequestHint` of the request that last touched it: the category (a pending tool call makes a
category of its own), the turn bucketed by ``turn_edges``, and the gap since the session's
previous request relative to the horizon (``gap_edges``: new, short, mid, long). The gap is the
session's, not the block's, so every block a request touches shares its class and a chain
leaves deepest first. Without a hint (below HBM, a trace without metadata) a block is in the
unknown category, classed by its own last reuse gap.

Learning, online from the past only. Every idle episode (from a release or hit to the next use,
resident or evicted: a miss on a remembered ghost is a use) is followed through doubling age
bins (from ``age_base_s``): it either is reused in a bin or outlives it. Per class and bin, a
Beta posterior of the hazard "reused in this bin, given idle when it began", counting only
episodes whose fate in the bin is known, so recent episodes bias nothing (right censoring); a
forgotten ghost stops its episode. The prior of each class is the hazard pooled over all classes
(``class_strength`` pseudo-episodes), whose own prior is Beta(``prior_alpha``, ``prior_beta``).
P(reused within the horizon | age a) = 1 − exp(−(Λ(a + H) − Λ(a))), Λ the cumulative hazard, H
the tier's running mean idle age at eviction (adaptive, as in v1), kept non-increasing in age
(a block's value never rises while it idles). With ``proportional`` (default) a class scales the
pooled age profile by its own P at age 0: per-class old-age bins hold few reuses, and their
noise reordered blocks against LRU.

Value. value = P × cost / bytes, where cost = min(``recompute_s``, ``lower_load_s``): what a later
use pays once the block falls to the tier below (a reload) or out (a recompute); 1 when neither
is known.

No signal, recency. The pooled prior has the same hazard in every doubling bin, so P falls with
idle age; values within ``margin`` (relative) plus ``margin_abs`` of each other tie, and ties go
to the older block (then the deeper). With no hint and no evidence the order is exactly LRU's.

Order and cost. Each class keeps its evictable blocks in a heap by (last touch, deepest first);
as P never rises with age, a class's oldest block is its best victim, and the victim is the
lowest-value head over the occupied classes: O(classes) per victim, O(log n) per add and hit,
O(bins) per clock step for the episodes. Orphans (blocks whose parent was evicted, which a
prefix hit cannot reach) go first, as in v1; otherwise the prefix tree is respected only through
deepest-first ties, not by construction.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, EvictionPolicy, check_param

GAPS = ("new", "short-gap", "mid-gap", "long-gap")
UNKNOWN = ""  # the category of blocks handed over without a hint
PENDING = "+tool"  # suffix of the category of a request whose reply is a pending tool call


@dataclass(frozen=True)
class BayesReuseParams:
    horizon_s: float = 0.0
    """Reuse counts if it comes within this long; 0 = adaptive (see ``horizon_factor``)."""
    horizon_factor: float = 1.0
    """Adaptive horizon = this × the running mean idle age of evicted blocks (LRB's boundary is
    the cache's eviction age; the factor is our assumption)."""
    prior_alpha: float = 0.2
    """Beta prior α of the pooled hazard in every age bin: weak, so evidence dominates quickly."""
    prior_beta: float = 1.8
    """Beta prior β of the pooled hazard: mean 0.1 in every doubling bin, so P falls with age
    (recency) until evidence says otherwise."""
    class_strength: float = 4.0
    """Pseudo-episodes of the pooled hazard in each class's prior: a class with fewer episodes
    than this follows the pool (shrinkage, so thin classes do not reorder on noise)."""
    margin: float = 0.25
    """Values within this fraction of each other (plus ``margin_abs``) tie and recency decides:
    estimates are noisy, and LRU is the safe order (our choice: with 0.1 and 0.01 the worst
    loss against LRU on sharegpt and lmsys was 2–3 times larger)."""
    margin_abs: float = 0.05
    """Absolute part of the tie band, in units of P (× the larger cost per byte)."""
    proportional: bool = True
    """Each class scales the pooled P(age) by its own P at age 0, instead of using its own age
    profile: the old-age bins where eviction is decided hold few reuses per class, and their
    noise reordered blocks against LRU (measured: sharegpt at 18954 blocks, 0.599 against
    LRU's 0.615 with per-class profiles)."""
    turn_edges: tuple[int, int, int] = (1, 2, 4)
    """Turn edges of the four turn buckets: first turn, second, third–fourth, later."""
    gap_edges: tuple[float, float] = (0.25, 2.0)
    """Last reuse gap edges, in horizons, between the short-, mid- and long-gap buckets."""
    max_categories: int = 16
    """Distinct categories learned apart (a pending tool call counts apart); later ones share
    the last class."""
    age_base_s: float = 0.0625
    """Upper edge of the first idle-age bin; each later bin doubles."""
    age_bins: int = 24
    """Idle-age bins per class (24 from 1/16 s reach ~6 days)."""
    ghost_factor: float = 4.0
    """Evicted keys remembered, as a multiple of the tier size: longer memory, later censoring."""
    ghost_horizons: float = 4.0
    """An evicted key idle longer than this many horizons is forgotten: not reused (censored)."""
    prefix_aware: bool = True
    """Blocks whose parent was evicted (orphans: a prefix hit cannot reach them) go first."""
    refresh_every: int = 4096
    """Outcomes (an episode reused in a bin, or outliving it: ~10 per episode) between
    recomputing P(reuse) from the posteriors; the refresh is O(classes × bins) and at 256 it
    took most of the policy's time (mooncake-toolagent: ~600 µs per access)."""

    def __post_init__(self) -> None:
        check_param(0 <= self.horizon_s <= 1e9, "horizon_s", "must be in [0, 1e9]")
        check_param(0 <= self.ghost_factor <= 1e9, "ghost_factor", "must be in [0, 1e9]")
        for name in ("horizon_factor", "prior_alpha", "prior_beta", "age_base_s",
                     "class_strength", "ghost_horizons"):  # fmt: skip
            check_param(0 < getattr(self, name) <= 1e9, name, "must be in (0, 1e9]")
        check_param(0 <= self.margin < 1, "margin", "must be in [0, 1)")
        check_param(0 <= self.margin_abs <= 1e9, "margin_abs", "must be in [0, 1e9]")
        check_param(1 <= self.age_bins <= 1024, "age_bins", "must be an integer in [1, 1024]")
        check_param(1 <= self.max_categories <= 1024, "max_categories",
                    "must be an integer in [1, 1024]")  # fmt: skip
        check_param(1 <= self.refresh_every < 2**31, "refresh_every",
                    "must be an integer in [1, 2^31)")  # fmt: skip
        for name in ("turn_edges", "gap_edges"):
            edges = getattr(self, name)
            ok = list(edges) == sorted(edges) and edges[0] >= 0 and edges[-1] <= 1e9
            check_param(ok, name, "must be non-decreasing numbers in [0, 1e9]")


class BayesReuse(EvictionPolicy):
    name = "bayes-reuse"
    Params = BayesReuseParams

    def __init__(self, params: BayesReuseParams | None = None) -> None:
        self.params = p = params or BayesReuseParams()
        bins = p.age_bins
        self._inv_base = 1.0 / p.age_base_s
        self._lower = [0.0] + [p.age_base_s * 2.0**b for b in range(bins - 1)]
        self._width = [p.age_base_s] + [p.age_base_s * 2.0**b for b in range(bins - 1)]
        self._upper = [p.age_base_s * 2.0**b for b in range(bins - 1)] + [math.inf]
        self._categories: dict[str, int] = {UNKNOWN: 0}
        classes = (p.max_categories + 1) * 16
        self.reuses = [[0] * bins for _ in range(classes)]  # episodes ended by reuse, per bin
        self.survived = [[0] * bins for _ in range(classes)]  # episodes that outlived the bin
        self._pooled: list[float] = []
        self._table: list[list[float]] = []  # class -> P(reuse within the horizon) per age bin
        # Per class: oldest-first heap of (last touch, -position, stamp, key) and newest-first
        # heap of (-last touch, -position, stamp, key); lazy deletion through `_live` (key ->
        # stamp of its live entries). A last pair of heaps holds the orphans.
        self._old: list[list[tuple[float, int, int, int]]] = [[] for _ in range(classes + 1)]
        self._count = [0] * (classes + 1)  # live entries per class
        self._orphans = classes
        self._live: dict[int, int] = {}
        self._stamp = 0
        self._entries = 0
        # key -> [class, last touch, cost per byte, parent (-1: orphan), position]
        self._meta: dict[int, list] = {}
        self._children: dict[int, list[int]] = {}  # parent -> keys added under it (may be stale)
        self._ghost: OrderedDict[int, float] = OrderedDict()  # evicted key -> last touch
        # Open idle episodes (resident or evicted): key -> (id, class, start), and their starts
        # in time order, for censoring.
        self._episodes: dict[int, tuple[int, int, float]] = {}
        # per age bin, the open episodes in it: (when they outlive it, key, id), in that order
        self._queues: list[deque[tuple[float, int, int]]] = [deque() for _ in range(bins)]
        self._eid = 0
        self._ghost_cap = 65536
        self._sessions: OrderedDict[int, list] = OrderedDict()  # -> [turn, gap bucket, last]
        self._returned: dict[int, float] = {}  # ghost key seen by `miss` -> its idle gap
        self._now = 0.0
        self._pending = 0
        self._hold = False  # defer refreshes inside one `evict`
        self._evicted_age = 0.0  # running mean idle age at eviction
        self._evictions = 0
        self.horizon_s = p.horizon_s or 1.0
        self._refresh()

    # -- learning ---------------------------------------------------------------------------------
    def set_capacity(self, blocks: int) -> None:
        self._ghost_cap = max(16, int(blocks * self.params.ghost_factor))

    def _bin(self, age: float) -> int:
        b = int(age * self._inv_base).bit_length() if age > 0 else 0
        return b if b < self.params.age_bins else self.params.age_bins - 1

    def _outcome(self, cls: int, b: int, reused: bool) -> None:
        """An idle episode of class ``cls`` in age bin ``b`` ended in a reuse, or outlived the
        bin (and goes on into the next)."""
        if reused:
            self.reuses[cls][b] += 1
        else:
            self.survived[cls][b] += 1
        self._pending += 1
        if self._pending >= self.params.refresh_every and not self._hold:
            self._refresh()

    def _within_horizon(self, hazards: list[float]) -> list[float]:
        """P(reuse within the horizon) at each bin's middle age, from per-bin hazards."""
        bins, lower, width, horizon = self.params.age_bins, self._lower, self._width, self.horizon_s
        rate = [-math.log1p(-min(h, 0.999999)) / w for h, w in zip(hazards, width, strict=True)]
        cum = [0.0] * (bins + 1)  # cumulative hazard at each bin's lower edge
        for b in range(bins):
            cum[b + 1] = cum[b] + rate[b] * width[b]

        def hazard_to(t: float) -> float:
            b = self._bin(t)
            return cum[b] + rate[b] * (t - lower[b])

        table = [
            -math.expm1(hazard_to(a) - hazard_to(a + horizon))
            for a in (lower[b] + 0.5 * width[b] for b in range(bins))
        ]
        for b in range(1, bins):  # the envelope: a block's value never rises while it idles
            table[b] = min(table[b], table[b - 1])
        return table

    def _refresh(self) -> None:
        """Recompute P(reuse within the horizon | class, age bin) from the hazard posteriors."""
        p = self.params
        self._pending = 0
        if not p.horizon_s and self._evictions:
            self.horizon_s = max(p.age_base_s, p.horizon_factor * self._evicted_age)
        bins, used = p.age_bins, len(self._categories) * 16
        # At risk in bin b: the episodes whose fate in it is known (reused in it, or outlived
        # it). Episodes still inside a bin wait, so recent ones bias nothing (right censoring).
        reuses = [sum(r[b] for r in self.reuses[:used]) for b in range(bins)]
        risk = [reuses[b] + sum(e[b] for e in self.survived[:used]) for b in range(bins)]
        a, ab = p.prior_alpha, p.prior_alpha + p.prior_beta
        pooled = [(reuses[b] + a) / (risk[b] + ab) for b in range(bins)]
        self._pooled = self._within_horizon(pooled)
        k = p.class_strength
        table = []
        for cls in range(used):
            r, survived = self.reuses[cls], self.survived[cls]
            if not any(r) and not any(survived):
                table.append(self._pooled)
                continue
            at_risk = [r[b] + survived[b] for b in range(bins)]
            hazards = [(r[b] + k * pooled[b]) / (at_risk[b] + k) for b in range(bins)]
            own = self._within_horizon(hazards)
            if p.proportional:  # the class scales the pooled age profile by its fresh P
                ratio = own[0] / self._pooled[0] if self._pooled[0] > 0 else 1.0
                own = [min(1.0, ratio * x) for x in self._pooled]
            table.append(own)
        self._table = table

    def reuse_probability(self, cls: int, age_s: float) -> float:
        """P(reuse within the horizon) of a block of class ``cls`` idle for ``age_s``."""
        table = self._table[cls] if cls < len(self._table) else self._pooled
        return table[self._bin(age_s)]

    # -- classes ----------------------------------------------------------------------------------
    def class_of(self, info: BlockInfo, gap: int) -> int:
        """The class of a block touched by ``info``'s request; ``gap`` indexes ``GAPS``."""
        hint = info.hint
        if hint is None:
            return gap
        if hint.session >= 0:  # one gap for the whole request, so its chain shares one class
            gap = self._session_gap(hint.session, hint.turn, info.now_s)
        name = hint.category + PENDING if hint.tool_wait_s >= 0 else hint.category
        cat = self._categories.get(name)
        if cat is None:
            cat = min(len(self._categories), self.params.max_categories)
            if cat == len(self._categories):
                self._categories[name] = cat
        turn = sum(hint.turn >= edge for edge in self.params.turn_edges)
        return cat * 16 + turn * 4 + gap

    def _session_gap(self, session: int, turn: int, now: float) -> int:
        """The gap bucket of a session's request: the time since the session's previous request
        last touched this tier (0, 'new', for a session not seen before)."""
        sessions = self._sessions
        state = sessions.get(session)
        if state is None:
            state = sessions[session] = [turn, 0, now]
            if len(sessions) > self._ghost_cap:
                sessions.popitem(last=False)
        elif state[0] != turn:
            state[0], state[1] = turn, self._gap(now - state[2])
            sessions.move_to_end(session)
        state[2] = now
        return state[1]

    def _gap(self, gap: float) -> int:
        short, mid = self.params.gap_edges
        horizon = self.horizon_s
        return 1 if gap < short * horizon else 2 if gap < mid * horizon else 3

    def _value(self, key: int, now: float) -> float:
        meta = self._meta[key]
        return self.reuse_probability(meta[0], now - meta[1]) * meta[2]

    # -- interface --------------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        """Move the clock: open idle episodes (resident or evicted blocks) that outlived their
        age bin count as survivors of it and move on to the next (the last bin has no end)."""
        if now == self._now:
            return
        self._now = now
        episodes, queues, upper = self._episodes, self._queues, self._upper
        for b in range(len(queues) - 1):
            queue = queues[b]
            while queue and queue[0][0] <= now:
                _, key, eid = queue.popleft()
                episode = episodes.get(key)
                if episode is not None and episode[0] == eid:
                    self._outcome(episode[1], b, False)
                    queues[b + 1].append((episode[2] + upper[b + 1], key, eid))

    def _start(self, key: int, cls: int, now: float) -> None:
        """An idle episode of ``key`` in class ``cls`` begins (replacing any open one)."""
        self._eid += 1
        self._episodes[key] = (self._eid, cls, now)
        self._queues[0].append((now + self._upper[0], key, self._eid))

    def _reused(self, key: int, now: float) -> None:
        """``key`` was used again: its open episode, if any, ended in a reuse."""
        episode = self._episodes.pop(key, None)
        if episode is not None:
            self._outcome(episode[1], self._bin(now - episode[2]), True)

    def miss(self, key: int, info: BlockInfo) -> None:
        self._advance(info.now_s)
        last = self._ghost.pop(key, None)
        if last is not None:  # an evicted block came back
            self._reused(key, info.now_s)
            self._returned[key] = info.now_s - last

    def _push(self, key: int, meta: list) -> None:
        """(Re)queue an evictable block; its older heap entries go stale."""
        self._stamp += 1
        stamp = self._stamp
        old = self._live.get(key)
        cls = self._orphans if meta[3] < 0 else meta[0]
        if old is not None:
            self._count[old[1]] -= 1
        self._live[key] = (stamp, cls)
        self._count[cls] += 1
        heapq.heappush(self._old[cls], (meta[1], -meta[4], stamp, key))
        self._entries += 1
        if self._entries > 2 * len(self._live) + 4096:
            self._compact()

    def _compact(self) -> None:
        """Drop stale heap entries in one pass: memory stays O(live)."""
        old: list[list[tuple[float, int, int, int]]] = [[] for _ in self._old]
        for key, (stamp, cls) in self._live.items():
            m = self._meta[key]
            old[cls].append((m[1], -m[4], stamp, key))
        for h in old:
            heapq.heapify(h)
        self._old, self._entries = old, len(self._live)

    def add(self, key: int, info: BlockInfo) -> None:
        now = info.now_s
        self._advance(now)
        meta = self._meta.get(key)
        if meta is not None:  # released after a hit: idle from now
            meta[1] = now
            self._start(key, meta[0], now)
        else:
            gap = self._returned.pop(key, None) if self._returned else None
            if gap is None:
                last = self._ghost.pop(key, None)
                if last is not None:  # came back without a `miss` call
                    self._reused(key, now)
                    gap = now - last
            cls = self.class_of(info, 0 if gap is None else self._gap(gap))
            self._start(key, cls, now)
            meta = self._meta[key] = [cls, now, self._cost(info), info.parent, info.position]
            if info.parent and self.params.prefix_aware:
                # A request releases its blocks deepest first, so a parent not yet added is
                # usually pinned by the same request; only one evicted recently is missing.
                if info.parent in self._ghost:
                    meta[3] = -1
                else:
                    self._link(info.parent, key)
        self._push(key, meta)

    def _link(self, parent: int, key: int) -> None:
        """Remember ``key`` as a child of ``parent``, to orphan it when the parent leaves."""
        children = self._children
        children.setdefault(parent, []).append(key)
        if len(children) > 4 * len(self._meta) + 4096:  # parents that never came: drop them
            meta = self._meta
            self._children = {k: v for k, v in children.items() if k in meta}

    @staticmethod
    def _cost(info: BlockInfo) -> float:
        """What a later use pays if the block is evicted here, per byte (1: unknown)."""
        recompute = info.recompute_s if info.recompute_s > 0 else math.inf
        cost = min(recompute, info.lower_load_s)
        return (cost if cost < math.inf else 1.0) / max(info.size_bytes, 1)

    def access(self, key: int, info: BlockInfo) -> None:
        now = info.now_s
        self._advance(now)
        meta = self._meta.get(key)
        if meta is None:
            return
        gap = now - meta[1]
        self._reused(key, now)
        meta[0] = self.class_of(info, self._gap(gap))
        self._start(key, meta[0], now)
        meta[1] = now
        meta[2] = self._cost(info)
        meta[4] = info.position
        if info.parent != meta[3] and self.params.prefix_aware:  # reached under a live parent
            meta[3] = info.parent
            if info.parent:
                self._link(info.parent, key)
        if key in self._live:
            self._push(key, meta)

    def discard(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self._count[entry[1]] -= 1

    def forget(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is None:
            return
        for child in self._children.pop(key, ()):
            m = self._meta.get(child)
            if m is not None and m[3] == key:  # orphaned: no prefix hit reaches it now
                m[3] = -1
                if child in self._live:
                    self._push(child, m)
        age = self._now - meta[1]
        self._evictions += 1
        self._evicted_age += (age - self._evicted_age) / min(self._evictions, 1024)
        ghost = self._ghost
        ghost[key] = meta[1]
        # Forgotten (too many, or idle too long): a return would go unseen, so its open episode
        # stops here, censored (no outcome in its current bin).
        oldest = self._now - self.params.ghost_horizons * self.horizon_s
        episodes = self._episodes
        while ghost and (len(ghost) > self._ghost_cap or next(iter(ghost.values())) < oldest):
            episodes.pop(ghost.popitem(last=False)[0], None)

    def _end(self, heap: list[tuple[float, int, int, int]]) -> tuple[float, int, int, int] | None:
        live = self._live
        while heap:
            entry = heap[0]
            state = live.get(entry[3])
            if state is not None and state[0] == entry[2]:
                return entry
            heapq.heappop(heap)
        return None

    def _candidate(self, cls: int) -> tuple[float, float, int, int, float] | None:
        """(value, last touch, -position, key, cost per byte) of the class's oldest block: P
        never rises with idle age, so it is the class's best victim."""
        old = self._end(self._old[cls])
        if old is None:
            return None
        meta = self._meta[old[3]]
        p = self.reuse_probability(meta[0], self._now - meta[1])
        return (p * meta[2], old[0], old[1], old[3], meta[2])

    def victim(self) -> int:
        orphan = self._end(self._old[self._orphans])
        if orphan is not None:
            return orphan[3]
        best = None
        count = self._count
        keep, slack = 1.0 - self.params.margin, self.params.margin_abs
        for cls in range(len(self._categories) * 16):
            if count[cls]:
                cand = self._candidate(cls)
                if cand is None:
                    continue
                if best is None:
                    best = cand
                    continue
                # Clearly worth less (beyond the noise band), or within it and older.
                band = slack * max(cand[4], best[4])
                if cand[0] < best[0] * keep - band or (
                    cand[0] * keep - band <= best[0] and cand[1:4] < best[1:4]
                ):
                    best = cand
        if best is None:
            raise LookupError("no evictable block")
        return best[3]

    def evict(self, count: int) -> list[int]:
        victims: list[int] = []
        self._hold = True
        try:
            while len(victims) < count:
                key = self.victim()
                self.discard(key)
                self.forget(key)
                victims.append(key)
        finally:
            self._hold = False
        return victims

    def __len__(self) -> int:
        return len(self._live)

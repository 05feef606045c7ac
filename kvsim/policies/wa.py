"""Workload-aware eviction: evict the block least likely to be reused, by request category.

After the WA policy of "KVCache Cache in the Wild" (Wang et al., USENIX ATC'25, arXiv
2506.02634, section 6; shared/reference/predictive-policies.md): within one request category
(the request's type × first turn or later turn) the probability that a block is reused follows an
exponential in its idle time, and the head blocks of a prompt are reused far more than its tail.

Every block belongs to a class: (category, first / later / unknown turn, position class). The
category and turn come from the request's `RequestHint` ('' and "unknown" without one); the
position classes split the chain at ``depth_edges``, so the head-versus-tail weight is learned
per class from the trace's past rather than assumed. Each class fits, online, a cure-rate
exponential: an idle episode ends in a reuse with probability ``pi``, after an exponential time of
rate ``lam``. Evidence: a hit (a reuse after the idle gap), a miss on a key this policy evicted
and still remembers (a ghost: a reuse), and an idle episode, resident or ghost, longer than
``ghost_gaps`` pooled mean gaps or pushed out of the ghost list (censored: no reuse). So
P(reuse | idle age a) = pi e^(-lam a) / (pi e^(-lam a) + 1 - pi), and the victim is the block with
the lowest log-odds ln(pi / (1 - pi)) - lam a. Each class's fit is shrunk towards the pooled fit
of all classes by ``prior_weight`` pseudo-episodes, so classes without evidence rank like LRU (the
pooled fit is the same for all, and the score falls with age alone).

Head before tail: within one (category, turn), a deeper position class never ranks above a
shallower one at the same age (its log-odds are capped by, its rate at least, the shallower
class's), because a block serves a hit only under its parent. Fitted freely, the deep classes of
sharegpt outranked the heads (their episodes end in reuse a little more often) and the policy
lost 25 % of the LRU-to-Belady gap at 8 % capacity (our first runs, without hints); with the
cap it ranks like LRU there.

Simplifications (ours): the paper weighs a block's prompt offset (head first) alongside its reuse
probability; here the offset enters through the position classes, whose own fits (under the cap)
weigh head against tail. Reuse gaps are means of observed gaps (censoring biases them short);
the fit refreshes every ``refresh_every`` episodes.

Since the score falls with age within a class, each class keeps its evictable blocks in LRU order
(a heap on last use, then release order, so a request's deepest block leaves first) and the
victim is the best of the class heads: O(classes) per victim, O(log n) per add and hit; a batch
``evict`` pops from a heap of class heads. Does not respect the prefix tree by construction (a
head block can leave before its tail); the engine never counts a hit past a missing parent.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from kvsim.policies.base import BlockInfo, EvictionPolicy, check_param
from kvsim.policies.lazy_heap import live_head

TURNS = ("first", "later", "unknown")


@dataclass(frozen=True)
class WorkloadAwareParams:
    depth_edges: tuple[int, ...] = (1, 4, 16)
    """Position edges of the position classes: block 0, blocks 1-3, 4-15, 16 and deeper. The
    head/tail split of ATC'25 section 4.4; the edges double the span per class (our choice)."""
    prior_weight: float = 16.0
    """Pseudo-episodes of the pooled fit in each class's fit (shrinkage; our assumption)."""
    prior_mean_gap_s: float = 60.0
    """Reuse gap assumed before any is observed (ATC'25: most reuses within minutes in Trace A)."""
    ghost_factor: float = 4.0
    """Evicted keys remembered, as a multiple of the tier size (as bayes-reuse)."""
    ghost_gaps: float = 4.0
    """A ghost idle longer than this many pooled mean gaps is censored (exponential: the chance
    it still comes back is e^-4, 2 %)."""
    min_effect: float = 0.5
    """A class's log-odds and log-rate move from the pooled fit only by what exceeds this
    (soft threshold, as the lasso's): differences within a factor e^0.5 = 1.65 are treated as
    noise and rank like LRU (our assumption)."""
    refresh_every: int = 64
    """Episodes between refits of the classes."""

    def __post_init__(self) -> None:
        edges = self.depth_edges
        ok = list(edges) == sorted(edges) and all(0 <= e <= 1e9 for e in edges)
        check_param(ok, "depth_edges", "must be non-decreasing integers in [0, 1e9]")
        check_param(0 <= self.prior_weight <= 1e9, "prior_weight", "must be in [0, 1e9]")
        check_param(0 <= self.min_effect <= 1e9, "min_effect", "must be in [0, 1e9]")
        for name in ("prior_mean_gap_s", "ghost_factor", "ghost_gaps"):
            check_param(0 < getattr(self, name) <= 1e9, name, "must be in (0, 1e9]")
        check_param(1 <= self.refresh_every < 2**31, "refresh_every",
                    "must be an integer in [1, 2^31)")  # fmt: skip


def _shrink(x: float, by: float) -> float:
    """Soft threshold: ``x`` moved towards 0 by ``by``, stopping at 0."""
    return math.copysign(max(abs(x) - by, 0.0), x)


class _Fit:
    """Evidence of one class: reuses, their summed gaps, censored episodes; the fitted log-odds
    of a reuse and its rate."""

    __slots__ = ("censored", "gap_sum", "log_odds", "rate", "reuses")

    def __init__(self, log_odds: float, rate: float) -> None:
        self.reuses = 0
        self.gap_sum = 0.0
        self.censored = 0
        self.log_odds = log_odds
        self.rate = rate


class WorkloadAware(EvictionPolicy):
    name = "wa"
    Params = WorkloadAwareParams

    def __init__(self, params: WorkloadAwareParams | None = None) -> None:
        self.params = p = params or WorkloadAwareParams()
        self._positions = len(p.depth_edges) + 1
        self._categories: dict[str, int] = {}
        self._fits: list[_Fit] = []
        self._heaps: list[list[tuple[float, int, int]]] = []  # per class: (last, order, key)
        self._live: dict[int, tuple[float, int, int]] = {}  # evictable key -> its heap entry
        self._meta: dict[int, list] = {}  # resident key -> [class, last use]
        self._ghost: OrderedDict[int, tuple[int, float]] = OrderedDict()  # key -> (class, last)
        self._ghost_cap = 65536
        self._episodes: deque[tuple[float, int]] = deque()  # (idle since, key), oldest first
        self._order = 0
        self._entries = 0
        self._now = 0.0
        self._pending = 0
        self._pooled = _Fit(0.0, 1.0 / p.prior_mean_gap_s)

    # -- classes and fits -------------------------------------------------------------------------
    def set_capacity(self, blocks: int) -> None:
        self._ghost_cap = max(16, int(blocks * self.params.ghost_factor))

    def _class(self, info: BlockInfo) -> int:
        hint = info.hint
        if hint is None:
            category, turn = "", 2
        else:
            category, turn = hint.category, 0 if hint.turn == 0 else 1
        index = self._categories.get(category)
        if index is None:
            index = self._categories[category] = len(self._categories)
            for _ in range(len(TURNS) * self._positions):
                self._fits.append(_Fit(self._pooled.log_odds, self._pooled.rate))
                self._heaps.append([])
        position = sum(info.position >= edge for edge in self.params.depth_edges)
        return (index * len(TURNS) + turn) * self._positions + position

    def _episode(self, cls: int, gap: float, reused: bool) -> None:
        fit = self._fits[cls]
        if reused:
            fit.reuses += 1
            fit.gap_sum += gap
        else:
            fit.censored += 1
        self._pending += 1

    def _refit(self) -> None:
        """Pooled fit from all classes, then each class shrunk towards it."""
        self._pending = 0
        p = self.params
        reuses = sum(f.reuses for f in self._fits)
        censored = sum(f.censored for f in self._fits)
        gaps = sum(f.gap_sum for f in self._fits)
        pooled = self._pooled
        pooled.log_odds = math.log((reuses + 1) / (censored + 1))
        pooled.rate = (reuses + 1) / (gaps + p.prior_mean_gap_s)
        share = 1.0 / (1.0 + math.exp(-pooled.log_odds))
        w = p.prior_weight
        for fit in self._fits:
            r, c = fit.reuses, fit.censored
            pi = (r + w * share) / (r + c + w) if r + c + w > 0 else share
            pi = min(max(pi, 1e-9), 1 - 1e-9)
            fit.log_odds = math.log(pi / (1 - pi))
            fit.rate = (r + w) / (fit.gap_sum + w / pooled.rate) if r + w > 0 else pooled.rate
            fit.log_odds = pooled.log_odds + _shrink(fit.log_odds - pooled.log_odds, p.min_effect)
            fit.rate = pooled.rate * math.exp(_shrink(math.log(fit.rate / pooled.rate),
                                                      p.min_effect))  # fmt: skip
        # A block serves a hit only under its parent: a deeper class never ranks above a
        # shallower one of the same (category, turn) at the same age (head worth >= tail).
        fits, positions = self._fits, self._positions
        for first in range(0, len(fits), positions):
            for cls in range(first + 1, first + positions):
                above, fit = fits[cls - 1], fits[cls]
                fit.log_odds = min(fit.log_odds, above.log_odds)
                fit.rate = max(fit.rate, above.rate)

    def reuse_probability(self, cls: int, age_s: float) -> float:
        """P(reuse | class, idle age) under the current fit (for tests and reports)."""
        fit = self._fits[cls]
        return 1.0 / (1.0 + math.exp(fit.rate * age_s - fit.log_odds))

    def _tick(self, now: float) -> None:
        self._now = now
        # Idle episodes older than the horizon are censored (no reuse), resident or ghost.
        oldest = now - self.params.ghost_gaps / self._pooled.rate
        episodes, meta, ghost = self._episodes, self._meta, self._ghost
        while episodes and episodes[0][0] < oldest:
            since, key = episodes.popleft()
            m = meta.get(key)
            if m is not None:
                if m[1] == since and not m[2]:
                    m[2] = True
                    self._episode(m[0], now - since, False)
            else:
                g = ghost.get(key)
                if g is not None and g[1] == since:
                    del ghost[key]
                    self._episode(g[0], now - since, False)
        if self._pending >= self.params.refresh_every:
            self._refit()

    def _idle(self, meta: list, key: int, now: float) -> None:
        """A new idle episode of ``key`` starts now."""
        meta[1] = now
        meta[2] = False
        self._episodes.append((now, key))

    # -- interface --------------------------------------------------------------------------------
    def miss(self, key: int, info: BlockInfo) -> None:
        self._tick(info.now_s)
        ghost = self._ghost.pop(key, None)
        if ghost is not None:  # it came back after we evicted it: that episode was a reuse
            self._episode(ghost[0], info.now_s - ghost[1], True)

    def add(self, key: int, info: BlockInfo) -> None:
        self._tick(info.now_s)
        meta = self._meta.get(key)
        if meta is None:
            ghost = self._ghost.pop(key, None)
            if ghost is not None:
                self._episode(ghost[0], info.now_s - ghost[1], True)
            meta = self._meta[key] = [self._class(info), info.now_s, False]
        self._idle(meta, key, info.now_s)
        self._order += 1
        entry = (info.now_s, self._order, key)
        self._live[key] = entry
        heapq.heappush(self._heaps[meta[0]], entry)
        self._entries += 1
        if self._entries > 2 * len(self._live) + 4096:
            self._compact()

    def access(self, key: int, info: BlockInfo) -> None:
        self._tick(info.now_s)
        meta = self._meta.get(key)
        if meta is None:
            return
        if not meta[2]:  # not already censored
            self._episode(meta[0], info.now_s - meta[1], True)
        meta[0] = self._class(info)
        self._idle(meta, key, info.now_s)
        if key in self._live:  # hit while evictable: requeue in its (new) class
            self._order += 1
            entry = (info.now_s, self._order, key)
            self._live[key] = entry
            heapq.heappush(self._heaps[meta[0]], entry)
            self._entries += 1

    def discard(self, key: int) -> None:
        self._live.pop(key, None)

    def forget(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is None:
            return
        if meta[2]:  # its episode was already censored
            return
        ghost = self._ghost
        ghost[key] = (meta[0], meta[1])
        while len(ghost) > self._ghost_cap:  # forgotten before its horizon: censored here
            cls, last = ghost.popitem(last=False)[1]
            self._episode(cls, self._now - last, False)

    def _compact(self) -> None:
        heaps: list[list[tuple[float, int, int]]] = [[] for _ in self._heaps]
        for key, entry in self._live.items():
            heaps[self._meta[key][0]].append(entry)
        for heap in heaps:
            heapq.heapify(heap)
        self._heaps, self._entries = heaps, len(self._live)

    def _score(self, cls: int, entry: tuple[float, int, int]) -> tuple[float, float, int]:
        fit = self._fits[cls]
        return (fit.log_odds - fit.rate * (self._now - entry[0]), entry[0], entry[1])

    def victim(self) -> int:
        best = None
        best_key = 0
        for cls, heap in enumerate(self._heaps):
            entry = live_head(heap, self._live)
            if entry is None:
                continue
            score = self._score(cls, entry)
            if best is None or score < best:
                best, best_key = score, entry[2]
        if best is None:
            raise LookupError("no evictable block")
        return best_key

    def evict(self, count: int) -> list[int]:
        # the fits and the clock do not move during one call, so class heads keep their scores
        heads = []
        for cls, heap in enumerate(self._heaps):
            entry = live_head(heap, self._live)
            if entry is not None:
                heads.append((*self._score(cls, entry), cls))
        heapq.heapify(heads)
        victims = []
        while len(victims) < count:
            if not heads:
                raise LookupError("no evictable block")
            cls = heads[0][3]
            key = self._heaps[cls][0][2]
            victims.append(key)
            self.discard(key)
            self.forget(key)
            entry = live_head(self._heaps[cls], self._live)
            if entry is None:
                heapq.heappop(heads)
            else:
                heapq.heapreplace(heads, (*self._score(cls, entry), cls))
        return victims

    def __len__(self) -> int:
        return len(self._live)

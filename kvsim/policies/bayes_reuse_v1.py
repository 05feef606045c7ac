"""Bayesian reuse predictor, first design (``bayes-reuse-v1``): evict the block with the lowest
expected saving per byte.

The previous design of ``bayes-reuse``, kept unchanged in behaviour for comparison with the
redesign in kvsim.policies.bayes_reuse, which also reads request metadata (issue 23).

Reconstruction of the predictor in arXiv 2604.26968 (only its abstract is public; see
shared/reference/algorithms.md), made time-aware. Every block belongs to one of 16
(block kind × transition kind) pairs:

- block kinds: the segment kind of the block's last token folded into four (``kind_map``:
  system, user, assistant, other). A block whose kind says nothing (``opaque`` or unknown, as in
  every block of the Mooncake traces) is classed by its depth in the chain instead
  (``depth_edges``): one class would leave the posterior nothing to separate;
- transition kinds: how the block reached its current state — ``new`` (first time cached),
  ``returned`` (cached again after an eviction this policy still remembers), ``reused`` (hit once
  since it was cached), ``hot`` (hit twice or more).

Each pair keeps, per idle-age bin (bins double from ``age_base_s``), a Beta-Bernoulli posterior
of the hazard "reused within this bin, given idle until it began". An idle episode ends in a
reuse (a hit, or a miss on a key evicted recently enough to be remembered: a ghost) or is
censored (the ghost is forgotten); that is the only evidence, so the learner is online and sees
no future. From the hazards, P(reuse within the horizon | pair, idle age) — so an old block of a
good pair decays and leaves. score = P × cost to bring the block back / bytes, where the cost is
``recompute_s`` when the tier knows it, else 1. The horizon adapts to the tier by default: the
mean idle age at eviction, i.e. "will it be reused before it would have been evicted anyway".

Each pair keeps its evictable blocks in LRU order; since P falls with age, the pair's oldest
block is its best victim, and the victim is the lowest-scoring of the 16 pair heads (ties: the
oldest). A request's blocks are released deepest first, so within a pair its deepest block
leaves first. O(16) per eviction, O(1) per add and hit. Does not respect the prefix tree by
construction.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from kvsim.policies.base import BlockInfo, EvictionPolicy, check_param
from kvsim.policies.lazy_heap import live_head

TRANSITIONS = ("new", "short-gap", "mid-gap", "long-gap")
BLOCK_KINDS = ("system", "user", "assistant", "other")
PAIRS = len(BLOCK_KINDS) * len(TRANSITIONS)


def _default_kind_map() -> dict[str, str]:
    return {
        "system": "system",
        "user": "user",
        "assistant": "assistant",
        "tool": "other",
        "document": "other",
    }


@dataclass(frozen=True)
class BayesReuseV1Params:
    horizon_s: float = 0.0
    """Reuse counts if it comes within this long; 0 = adaptive (see ``horizon_factor``)."""
    horizon_factor: float = 1.0
    """Adaptive horizon = this × the running mean idle age of evicted blocks (our assumption)."""
    prior_alpha: float = 0.2
    """Beta prior α of every (pair, age bin) hazard: weak, so evidence dominates quickly."""
    prior_beta: float = 1.8
    """Beta prior β; the prior mean hazard 0.1 keeps unobserved old ages pessimistic."""
    kind_map: dict[str, str] = field(default_factory=_default_kind_map)
    """Segment kind -> block kind; kinds not listed are classed by depth."""
    depth_edges: tuple[int, int, int] = (1, 4, 32)
    """Position edges of the four depth classes used for blocks of an unlisted kind."""
    age_base_s: float = 0.0625
    """Upper edge of the first idle-age bin; each later bin doubles."""
    age_bins: int = 24
    """Idle-age bins per pair (24 from 1/16 s reach ~6 days)."""
    ghost_factor: float = 4.0
    """Evicted keys remembered, as a multiple of the tier size: longer memory, later censoring."""
    ghost_horizons: float = 4.0
    """An evicted key idle longer than this many horizons is forgotten: no reuse (censored)."""
    gap_edges: tuple[float, float] = (0.25, 2.0)
    """Last reuse gap edges, in horizons, between the short-, mid- and long-gap transitions."""
    prefix_aware: bool = True
    """Blocks whose parent was evicted (orphans: a prefix hit cannot reach them) go first."""
    refresh_every: int = 256
    """Episodes between recomputing P(reuse) from the posteriors."""

    def __post_init__(self) -> None:
        for name in ("horizon_s", "ghost_factor"):
            check_param(0 <= getattr(self, name) <= 1e9, name, "must be in [0, 1e9]")
        for name in ("horizon_factor", "prior_alpha", "prior_beta", "age_base_s",
                     "ghost_horizons"):  # fmt: skip
            check_param(0 < getattr(self, name) <= 1e9, name, "must be in (0, 1e9]")
        check_param(1 <= self.age_bins <= 1024, "age_bins", "must be an integer in [1, 1024]")
        check_param(1 <= self.refresh_every < 2**31, "refresh_every",
                    "must be an integer in [1, 2^31)")  # fmt: skip
        for name in ("depth_edges", "gap_edges"):
            edges = getattr(self, name)
            ok = list(edges) == sorted(edges) and edges[0] >= 0 and edges[-1] <= 1e9
            check_param(ok, name, "must be non-decreasing numbers in [0, 1e9]")
        for kind, block in self.kind_map.items():
            check_param(isinstance(kind, str) and block in BLOCK_KINDS, "kind_map",
                        f"maps segment kinds to one of {', '.join(BLOCK_KINDS)}; "
                        f"got {kind!r}: {block!r}")  # fmt: skip


class BayesReuseV1(EvictionPolicy):
    name = "bayes-reuse-v1"
    Params = BayesReuseV1Params

    def __init__(self, params: BayesReuseV1Params | None = None) -> None:
        self.params = p = params or BayesReuseV1Params()
        bins = p.age_bins
        self._inv_base = 1.0 / p.age_base_s
        self._kind_index = {seg: BLOCK_KINDS.index(k) for seg, k in p.kind_map.items()}
        self.reuses = [[0] * bins for _ in range(PAIRS)]  # episodes ended by reuse, per age bin
        self.exits = [[0] * bins for _ in range(PAIRS)]  # episodes ended (reuse or censored)
        self._table = [[0.5] * bins for _ in range(PAIRS)]  # P(reuse within horizon) per bin
        # One heap per pair, (last touch, -position, key): oldest first, deepest first among
        # blocks touched together; a last heap for orphans. Lazy deletion through `_live`.
        self._heaps: list[list[tuple[float, int, int]]] = [[] for _ in range(PAIRS + 1)]
        self._live: dict[int, tuple[float, int, int]] = {}
        self._entries = 0
        # key -> [pair, last touch, cost per byte, hits, parent (-1: orphan), position]
        self._meta: dict[int, list] = {}
        self._children: dict[int, list[int]] = {}  # parent -> keys added under it (may be stale)
        self._ghost: OrderedDict[int, tuple[int, float]] = OrderedDict()  # key -> (pair, last)
        self._ghost_cap = 65536
        self._now = 0.0
        self._pending = 0
        self._evicted_age = 0.0  # running mean idle age at eviction
        self._evictions = 0
        self.horizon_s = p.horizon_s or 1.0

    # -- learning ---------------------------------------------------------------------------------
    def set_capacity(self, blocks: int) -> None:
        self._ghost_cap = max(16, int(blocks * self.params.ghost_factor))

    def _bin(self, age: float) -> int:
        b = int(age * self._inv_base).bit_length() if age > 0 else 0
        return b if b < self.params.age_bins else self.params.age_bins - 1

    def _episode(self, pair: int, age: float, reused: bool) -> None:
        b = self._bin(age)
        self.exits[pair][b] += 1
        if reused:
            self.reuses[pair][b] += 1
        self._pending += 1
        if self._pending >= self.params.refresh_every:
            self._refresh()

    def _refresh(self) -> None:
        """Recompute P(reuse within the horizon | pair, age bin) from the hazard posteriors."""
        p = self.params
        self._pending = 0
        if not p.horizon_s and self._evictions:
            self.horizon_s = max(p.age_base_s, p.horizon_factor * self._evicted_age)
        horizon = self.horizon_s
        bins = p.age_bins
        lower = [0.0] + [p.age_base_s * 2.0**b for b in range(bins - 1)]
        width = [p.age_base_s] + [p.age_base_s * 2.0**b for b in range(bins - 1)]
        for pair in range(PAIRS):
            reuses, exits = self.reuses[pair], self.exits[pair]
            at_risk = 0
            rate = [0.0] * bins  # hazard per second within each bin
            for b in range(bins - 1, -1, -1):
                at_risk += exits[b]
                h = (reuses[b] + p.prior_alpha) / (at_risk + p.prior_alpha + p.prior_beta)
                rate[b] = -math.log1p(-min(h, 0.999999)) / width[b]
            cum = [0.0] * (bins + 1)  # cumulative hazard at each bin's lower edge
            for b in range(bins):
                cum[b + 1] = cum[b] + rate[b] * width[b]

            def hazard_to(t: float, rate=rate, cum=cum) -> float:
                b = self._bin(t)
                return cum[b] + rate[b] * (t - lower[b])

            self._table[pair] = [
                -math.expm1(hazard_to(a) - hazard_to(a + horizon))
                for a in (lower[b] + 0.5 * width[b] for b in range(bins))
            ]

    def reuse_probability(self, kind: str, transition: str, age_s: float) -> float:
        """P(reuse within the horizon) of a block of this pair idle for ``age_s`` (for tests)."""
        pair = BLOCK_KINDS.index(kind) * 4 + TRANSITIONS.index(transition)
        return self._table[pair][self._bin(age_s)]

    # -- interface --------------------------------------------------------------------------------
    def _block_kind(self, info: BlockInfo) -> int:
        kind = self._kind_index.get(info.kind)
        if kind is not None:
            return kind
        edges, position = self.params.depth_edges, info.position
        return sum(position >= edge for edge in edges)

    def _transition(self, gap: float) -> int:
        short, mid = self.params.gap_edges
        horizon = self.horizon_s
        return 1 if gap < short * horizon else 2 if gap < mid * horizon else 3

    def miss(self, key: int, info: BlockInfo) -> None:
        self._now = info.now_s

    def _push(self, key: int, meta: list) -> None:
        """(Re)queue an evictable block; its older heap entries go stale."""
        entry = (meta[1], -meta[5], key)
        self._live[key] = entry
        heapq.heappush(self._heaps[PAIRS if meta[4] < 0 else meta[0]], entry)
        self._entries += 1
        if self._entries > 2 * len(self._live) + 4096:  # drop stale entries in one pass
            heaps: list[list[tuple[float, int, int]]] = [[] for _ in range(PAIRS + 1)]
            for k, e in self._live.items():
                m = self._meta[k]
                heaps[PAIRS if m[4] < 0 else m[0]].append(e)
            for h in heaps:
                heapq.heapify(h)
            self._heaps, self._entries = heaps, len(self._live)

    def add(self, key: int, info: BlockInfo) -> None:
        now = self._now = info.now_s
        meta = self._meta.get(key)
        if meta is None:
            transition = 0
            ghost = self._ghost.pop(key, None)
            if ghost is not None:  # it came back: the evicted episode ended in a reuse
                self._episode(ghost[0], now - ghost[1], True)
                transition = self._transition(now - ghost[1])
            cost = info.recompute_s if info.recompute_s > 0 else 1.0
            meta = self._meta[key] = [
                self._block_kind(info) * 4 + transition,
                now,
                cost / max(info.size_bytes, 1),
                0,
                info.parent,
                info.position,
            ]
            if info.parent and self.params.prefix_aware:
                if info.parent in self._meta:
                    self._children.setdefault(info.parent, []).append(key)
                else:
                    meta[4] = -1  # added under a parent this tier does not hold
        self._push(key, meta)

    def access(self, key: int, info: BlockInfo) -> None:
        now = self._now = info.now_s
        meta = self._meta.get(key)
        if meta is None:
            return
        pair = meta[0]
        self._episode(pair, now - meta[1], True)
        meta[3] += 1
        meta[0] = pair - pair % 4 + self._transition(now - meta[1])
        meta[1] = now
        meta[5] = info.position
        if info.parent != meta[4] and self.params.prefix_aware:  # reached under a live parent
            meta[4] = info.parent
            if info.parent:
                self._children.setdefault(info.parent, []).append(key)
        if key in self._live:
            self._push(key, meta)

    def discard(self, key: int) -> None:
        self._live.pop(key, None)

    def forget(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is None:
            return
        for child in self._children.pop(key, ()):
            m = self._meta.get(child)
            if m is not None and m[4] == key:  # orphaned: no prefix hit reaches it now
                m[4] = -1
                if child in self._live:
                    self._push(child, m)
        age = self._now - meta[1]
        self._evictions += 1
        self._evicted_age += (age - self._evicted_age) / min(self._evictions, 1024)
        ghost = self._ghost
        ghost[key] = (meta[0], meta[1])
        # Forgotten without coming back (too many, or idle too long): censored at that age.
        oldest = self._now - self.params.ghost_horizons * self.horizon_s
        while ghost and (len(ghost) > self._ghost_cap or next(iter(ghost.values()))[1] < oldest):
            pair, last = ghost.popitem(last=False)[1]
            self._episode(pair, self._now - last, False)

    def victim(self) -> int:
        heaps = self._heaps
        orphan = live_head(heaps[PAIRS], self._live)
        if orphan is not None:
            return orphan[2]
        now = self._now
        meta = self._meta
        table = self._table
        best = None
        best_score = 0.0
        for pair in range(PAIRS):
            entry = live_head(heaps[pair], self._live)
            if entry is None:
                continue
            score = table[pair][self._bin(now - entry[0])] * meta[entry[2]][2]
            if best is None or score < best_score or (score == best_score and entry < best):
                best, best_score = entry, score
        if best is None:
            raise LookupError("no evictable block")
        return best[2]

    def __len__(self) -> int:
        return len(self._live)

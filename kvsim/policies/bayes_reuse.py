"""Bayesian reuse predictor: evict the block with the lowest expected saving per byte.

Reconstruction of the predictor in arXiv 2604.26968 (only its abstract is public; see
shared/reference/algorithms.md). Every block belongs to one of 16 (block kind × transition kind)
pairs, each with a Beta(α, β) posterior over "reused within the horizon":

- block kinds (``kind_map``): the segment kind of the block's last token, folded into four
  classes — system, user, assistant, other (tool output, documents, opaque);
- transition kinds: how the block reached its current state — ``new`` (first time cached),
  ``returned`` (cached again after an eviction this policy remembers), ``reused`` (hit once since
  it was cached), ``hot`` (hit twice or more).

Each state opens an episode. A hit within ``horizon_s`` of the episode's start adds 1 to α of the
episode's pair; a hit after it, or an eviction, adds 1 to β. P(reuse) = α / (α + β).
score = P(reuse) × cost to bring the block back / bytes, where the cost is ``recompute_s`` when
the tier knows it, else 1. The lowest score goes; within a pair, the oldest touch, and the deepest
block among those touched together. Posteriors are shared by the whole pair, so the victim search
looks at the cheapest block of each of the 16 pairs: O(16 + log n) per eviction.

Does not respect the prefix tree by construction; deepest-first ties keep a request's head longest.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from kvsim.policies.base import BlockInfo, EvictionPolicy

TRANSITIONS = ("new", "returned", "reused", "hot")
BLOCK_KINDS = ("system", "user", "assistant", "other")


def _default_kind_map() -> dict[str, str]:
    return {"system": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class BayesReuseParams:
    horizon_s: float = 600.0
    """A hit later than this after the episode began counts as no reuse (our assumption)."""
    prior_alpha: float = 1.0
    """Beta prior α of every pair (1, 1 = uniform: no opinion before evidence)."""
    prior_beta: float = 1.0
    """Beta prior β of every pair."""
    kind_map: dict[str, str] = field(default_factory=_default_kind_map)
    """Segment kind -> block kind; kinds not listed are 'other'."""
    ghost_factor: float = 2.0
    """Evicted keys remembered (to tell 'returned' from 'new'), as a multiple of the tier size."""


class BayesReuse(EvictionPolicy):
    name = "bayes-reuse"
    Params = BayesReuseParams

    def __init__(self, params: BayesReuseParams | None = None) -> None:
        self.params = p = params or BayesReuseParams()
        self.alpha = [p.prior_alpha] * 16
        self.beta = [p.prior_beta] * 16
        self._kind_index = {seg: BLOCK_KINDS.index(k) for seg, k in p.kind_map.items()}
        self._heaps: list[list[tuple[float, float, int, int]]] = [[] for _ in range(16)]
        self._live: dict[int, tuple[float, float, int, int]] = {}
        self._meta: dict[int, list] = {}  # key -> [pair, episode start, cost per byte, hits]
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._ghost_cap = 65536
        self._entries = 0  # heap entries, live and stale

    def set_capacity(self, blocks: int) -> None:
        self._ghost_cap = max(1, int(blocks * self.params.ghost_factor))

    def posterior(self) -> dict[tuple[str, str], float]:
        """P(reuse) per (block kind, transition kind)."""
        return {
            (BLOCK_KINDS[i // 4], TRANSITIONS[i % 4]): self.alpha[i]
            / (self.alpha[i] + self.beta[i])
            for i in range(16)
        }

    def counts(self, kind: str, transition: str) -> tuple[float, float]:
        """(α, β) of one pair, priors included."""
        i = BLOCK_KINDS.index(kind) * 4 + TRANSITIONS.index(transition)
        return self.alpha[i], self.beta[i]

    def _push(self, key: int, meta: list, info: BlockInfo) -> None:
        entry = (meta[2], info.now_s, -info.position, key)
        self._live[key] = entry
        heapq.heappush(self._heaps[meta[0]], entry)
        self._entries += 1
        if self._entries > 2 * len(self._live) + 4096:  # drop stale entries in one pass
            heaps: list[list[tuple[float, float, int, int]]] = [[] for _ in range(16)]
            for k, e in self._live.items():
                heaps[self._meta[k][0]].append(e)
            for h in heaps:
                heapq.heapify(h)
            self._heaps, self._entries = heaps, len(self._live)

    def add(self, key: int, info: BlockInfo) -> None:
        meta = self._meta.get(key)
        if meta is None:
            kind = self._kind_index.get(info.kind, 3)
            transition = 1 if self._ghost.pop(key, 0) is None else 0
            cost = info.recompute_s if info.recompute_s > 0 else 1.0
            meta = self._meta[key] = [
                kind * 4 + transition,
                info.now_s,
                cost / max(info.size_bytes, 1),
                0,
            ]
        self._push(key, meta, info)

    def access(self, key: int, info: BlockInfo) -> None:
        meta = self._meta.get(key)
        if meta is None:
            return
        pair = meta[0]
        if info.now_s - meta[1] <= self.params.horizon_s:
            self.alpha[pair] += 1
        else:
            self.beta[pair] += 1
        meta[3] += 1
        meta[0] = pair - pair % 4 + (2 if meta[3] == 1 else 3)
        meta[1] = info.now_s
        if key in self._live:
            self._push(key, meta, info)

    def discard(self, key: int) -> None:
        self._live.pop(key, None)

    def forget(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is None:
            return
        self.beta[meta[0]] += 1
        ghost = self._ghost
        ghost[key] = None
        if len(ghost) > self._ghost_cap:
            ghost.popitem(last=False)

    def victim(self) -> int:
        live = self._live
        best = None
        best_score = 0.0
        for pair, heap in enumerate(self._heaps):
            while heap and live.get(heap[0][3]) is not heap[0]:
                heapq.heappop(heap)
            if not heap:
                continue
            top = heap[0]
            score = self.alpha[pair] / (self.alpha[pair] + self.beta[pair]) * top[0]
            if best is None or score < best_score or (score == best_score and top[1:] < best[1:]):
                best, best_score = top, score
        if best is None:
            raise LookupError("no evictable block")
        return best[3]

    def __len__(self) -> int:
        return len(self._live)

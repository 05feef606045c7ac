"""Learned eviction, after LRB (Song et al., "Learning Relaxed Belady for Content Distribution
Network Caching", NSDI'20): a model trained online predicts whether a block is reused within the
Belady boundary, and eviction drops the sampled candidate it rates least likely.

Labels are relaxed Belady's: a sample (a block's features at one moment) is positive if the block
is used again within the boundary (about the tier's eviction age: ``boundary_factor`` × the
running mean idle age at eviction), negative once the boundary has passed without a use. A label
is assigned only when the reuse happens or the boundary passes, so nothing is read from the
future. Samples are taken at every ``sample_every``-th touch and from each eviction's candidate
set (so idle ages the scorer sees are trained on); evicted keys keep their pending samples, and
their return (a miss) labels them positive.

Features: the request's category, turn, first-turn flag, a pending tool call (from its
`RequestHint`; unknown without one), the block's position, idle age, last reuse gap, hits so far,
and the request's prompt tokens. The model is scikit-learn's ``HistGradientBoostingClassifier``
(the ``learned`` extra), refit every ``retrain_every`` labels on a sliding window of the last
``window`` labels, single-threaded, with a fixed ``random_state``.

Eviction scores a candidate set in one batch, the ``oldest`` least recently used blocks plus
``candidates`` sampled at random (a seeded generator, so the same inputs give the same
decisions), and drops the lowest (ties: the older, then the deeper). Until the first model is
trained the order is LRU. Orphans (blocks whose parent was evicted, which a prefix hit cannot
reach) go first; otherwise the prefix tree is not respected by construction. Cost:
O(candidates) plus one model call per ``evict``, and a refit per ``retrain_every`` labels;
``retrains``, ``predict_calls``, ``train_s`` and ``predict_s`` count it (wall seconds, for
reports only, never used in a decision).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import islice
from typing import Any

from kvsim.errors import ConfigError
from kvsim.policies.base import BlockInfo, EvictionPolicy, check_param

FEATURES = (
    "category",
    "turn",
    "first_turn",
    "tool_pending",
    "position",
    "idle_age_s",
    "last_gap_s",
    "hits",
    "request_tokens",
)


def _classifier(params: LearnedParams) -> Any:
    """A fresh model; scikit-learn is optional, so it is imported here."""
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier
    except ImportError:
        raise ConfigError(
            "policy 'learned' needs scikit-learn: pip install 'kvsim[learned]'"
        ) from None
    return HistGradientBoostingClassifier(
        max_iter=params.max_iter,
        max_leaf_nodes=15,
        learning_rate=0.1,
        categorical_features=[0],
        early_stopping=False,
        random_state=params.seed,
    )


@dataclass(frozen=True)
class LearnedParams:
    boundary_s: float = 0.0
    """Belady boundary: a reuse counts if it comes within this long; 0 = adaptive."""
    boundary_factor: float = 1.0
    """Adaptive boundary = this × the running mean idle age at eviction (LRB sets it near the
    cache's eviction age)."""
    window: int = 20_000
    """Labelled samples kept for training (sliding window; LRB's memory window is similar in
    spirit, counted in requests)."""
    retrain_every: int = 5_000
    """New labels between refits."""
    min_samples: int = 1_000
    """Labels needed, with both outcomes present, before the first model; LRU order until then."""
    sample_every: int = 4
    """Every this-many-th block touch is sampled (deterministic stride)."""
    candidates: int = 0
    """Random evictable blocks added to each candidate set (LRB samples 64 at random). Off by
    default: random candidates include prefix heads, and measured on sharegpt at 5054 blocks
    (prefix replay) 16 of them took the hit ratio from LRU's 0.243 to 0.230."""
    oldest: int = 64
    """Least recently used blocks in each candidate set: the model reorders LRU's tail."""
    max_iter: int = 32
    """Boosting rounds per refit: a small model keeps the refit cost modest."""
    seed: int = 0
    """Seed of the candidate sampler and the model."""
    prefix_aware: bool = True
    """Blocks whose parent was evicted go first."""

    def __post_init__(self) -> None:
        check_param(0 <= self.boundary_s <= 1e9, "boundary_s", "must be in [0, 1e9]")
        check_param(0 < self.boundary_factor <= 1e9, "boundary_factor", "must be in (0, 1e9]")
        for name in ("window", "retrain_every", "min_samples", "sample_every", "max_iter"):
            value = getattr(self, name)
            check_param(1 <= value < 2**31, name, "must be an integer in [1, 2^31)")
        for name in ("candidates", "oldest"):
            value = getattr(self, name)
            check_param(0 <= value < 2**31, name, "must be an integer in [0, 2^31)")
        check_param(self.candidates + self.oldest >= 1, "candidates",
                    "plus 'oldest' must be at least 1")  # fmt: skip
        check_param(0 <= self.seed < 2**32, "seed", "must be an integer in [0, 2^32)")


class Learned(EvictionPolicy):
    name = "learned"
    Params = LearnedParams

    def __init__(self, params: LearnedParams | None = None) -> None:
        self.params = p = params or LearnedParams()
        _classifier(p)  # fail at construction, with one line, when scikit-learn is missing
        import numpy as np

        self._np = np
        self._rng = np.random.default_rng(p.seed)
        self._model: Any = None
        self._threads: Any = None
        # key -> [last touch, last gap (-1: none), hits, position, category, turn, tool pending,
        #         request tokens, parent (-1: orphan)]
        self._meta: dict[int, list] = {}
        self._order: OrderedDict[int, None] = OrderedDict()  # evictable keys, LRU first
        self._keys: list[int] = []  # evictable keys, for sampling
        self._index: dict[int, int] = {}
        self._orphans: OrderedDict[int, None] = OrderedDict()
        self._children: dict[int, list[int]] = {}
        self._categories: dict[str, int] = {}
        self._touches = 0
        # Unlabelled samples: (deadline, key, features), in deadline order; per key the open ones.
        self._open: deque[list] = deque()
        self._by_key: dict[int, list[list]] = {}
        self._x: deque[tuple] = deque(maxlen=p.window)
        self._y: deque[int] = deque(maxlen=p.window)
        self._new_labels = 0
        self._now = 0.0
        self._evicted_age = 0.0
        self._evictions = 0
        self.boundary_s = p.boundary_s or 1.0
        self.retrains = 0
        self.predict_calls = 0
        self.train_s = 0.0
        self.predict_s = 0.0

    # -- features and labels ----------------------------------------------------------------------
    def _features(self, meta: list, now: float) -> tuple:
        return (meta[4], meta[5], float(meta[5] == 0), meta[6], meta[3], now - meta[0], meta[1],
                meta[2], meta[7])  # fmt: skip

    def _sample(self, key: int, meta: list, now: float) -> None:
        sample = [now + self.boundary_s, key, self._features(meta, now)]
        self._open.append(sample)
        self._by_key.setdefault(key, []).append(sample)

    def _label(self, features: tuple, reused: bool) -> None:
        self._x.append(features)
        self._y.append(int(reused))
        self._new_labels += 1

    def _used(self, key: int) -> None:
        """``key`` was used now: its open samples are positive (their boundary has not passed,
        or `_expire` would have closed them)."""
        for sample in self._by_key.pop(key, ()):
            if sample[1] is not None:
                self._label(sample[2], True)
                sample[1] = None  # closed

    def _expire(self, now: float) -> None:
        """Close every sample whose boundary has passed: negative."""
        open_ = self._open
        while open_ and open_[0][0] < now:
            sample = open_.popleft()
            key = sample[1]
            if key is None:
                continue
            self._label(sample[2], False)
            sample[1] = None
            left = [s for s in self._by_key.get(key, ()) if s[1] is not None]
            if left:
                self._by_key[key] = left
            else:
                self._by_key.pop(key, None)
        if self._new_labels >= self.params.retrain_every or (
            self._model is None and self._new_labels >= self.params.min_samples
        ):
            self._retrain()

    def _one_thread(self) -> Any:
        """Fit and predict on one thread: the simulator runs beside other work, and OpenMP's
        thread start-up costs more than a 100-row prediction (measured: 128 ms against 1.7 ms)."""
        if self._threads is None:
            from threadpoolctl import ThreadpoolController

            self._threads = ThreadpoolController()
        return self._threads.limit(limits=1)

    def _retrain(self) -> None:
        y = self._y
        if len(y) < self.params.min_samples or len(set(y)) < 2:
            return
        np = self._np
        started = time.perf_counter()
        model = _classifier(self.params)
        with self._one_thread():
            model.fit(np.asarray(self._x, dtype=np.float64), np.asarray(y, dtype=np.int8))
        self._model = model
        self._new_labels = 0
        self.retrains += 1
        self.train_s += time.perf_counter() - started

    def _predict(self, rows: list[tuple]) -> Any:
        started = time.perf_counter()
        with self._one_thread():
            p = self._model.predict_proba(self._np.asarray(rows, dtype=self._np.float64))[:, 1]
        self.predict_calls += 1
        self.predict_s += time.perf_counter() - started
        return p

    # -- interface --------------------------------------------------------------------------------
    def _describe(self, info: BlockInfo) -> tuple[int, int, int]:
        hint = info.hint
        if hint is None:
            return -1, -1, -1
        cat = self._categories.setdefault(hint.category, len(self._categories))
        return min(cat, 250), hint.turn, int(hint.tool_wait_s >= 0)

    def _touch_sample(self, key: int, meta: list, now: float) -> None:
        self._touches += 1
        if self._touches % self.params.sample_every == 0:
            self._sample(key, meta, now)

    def miss(self, key: int, info: BlockInfo) -> None:
        self._advance(info.now_s)
        if key in self._by_key:  # an evicted key is back
            self._used(key)

    def _advance(self, now: float) -> None:
        if now != self._now:
            self._now = now
            self._expire(now)

    def add(self, key: int, info: BlockInfo) -> None:
        now = info.now_s
        self._advance(now)
        meta = self._meta.get(key)
        if meta is None:
            self._used(key)  # came back without a `miss` call
            cat, turn, tool = self._describe(info)
            meta = self._meta[key] = [now, -1.0, 0, info.position, cat, turn, tool,
                                      info.request_tokens, info.parent]  # fmt: skip
            if info.parent and self.params.prefix_aware:
                self._children.setdefault(info.parent, []).append(key)
            self._touch_sample(key, meta, now)
        self._order[key] = None
        self._order.move_to_end(key)
        if key not in self._index:
            self._index[key] = len(self._keys)
            self._keys.append(key)

    def access(self, key: int, info: BlockInfo) -> None:
        now = info.now_s
        self._advance(now)
        meta = self._meta.get(key)
        if meta is None:
            return
        self._used(key)
        cat, turn, tool = self._describe(info)
        meta[1], meta[0] = now - meta[0], now
        meta[2] += 1
        meta[3:8] = [info.position, cat, turn, tool, info.request_tokens]
        if info.parent != meta[8] and self.params.prefix_aware:
            meta[8] = info.parent
            self._orphans.pop(key, None)
            if info.parent:
                self._children.setdefault(info.parent, []).append(key)
        self._touch_sample(key, meta, now)
        if key in self._order:
            self._order.move_to_end(key)

    def discard(self, key: int) -> None:
        if self._order.pop(key, 0) is None:
            i = self._index.pop(key)
            last = self._keys.pop()
            if last != key:
                self._keys[i] = last
                self._index[last] = i
            self._orphans.pop(key, None)

    def forget(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is None:
            return
        for child in self._children.pop(key, ()):
            m = self._meta.get(child)
            if m is not None and m[8] == key:
                m[8] = -1
                if child in self._order:
                    self._orphans[child] = None
        self._evictions += 1
        age = self._now - meta[0]
        self._evicted_age += (age - self._evicted_age) / min(self._evictions, 1024)
        if not self.params.boundary_s:
            self.boundary_s = self.params.boundary_factor * max(self._evicted_age, 1e-6)

    def victim(self) -> int:
        if self._orphans:
            return next(iter(self._orphans))
        if not self._order:
            raise LookupError("no evictable block")
        if self._model is None:
            return next(iter(self._order))
        return self._choose(1)[0]

    def _choose(self, count: int) -> list[int]:
        """The ``count`` lowest-rated of a candidate set: the oldest plus a seeded sample."""
        p, keys = self.params, self._keys
        pool = list(islice(self._order, p.oldest + count))
        extra = min(p.candidates, len(keys))
        if extra:
            picks = self._rng.choice(len(keys), size=extra, replace=False).tolist()
            pool = list(dict.fromkeys(pool + [keys[i] for i in picks]))
        now, meta = self._now, self._meta
        rows = [self._features(meta[k], now) for k in pool]
        scores = self._predict(rows).tolist()
        for k in pool[: p.oldest]:  # the idle ages the scorer meets get labels too
            self._sample(k, meta[k], now)
        ranked = sorted(
            range(len(pool)), key=lambda i: (scores[i], meta[pool[i]][0], -meta[pool[i]][3])
        )
        return [pool[i] for i in ranked[:count]]

    def evict(self, count: int) -> list[int]:
        victims: list[int] = []
        while len(victims) < count:
            if self._orphans or self._model is None or not self._order:
                key = self.victim()
                chosen = [key]
            else:
                chosen = self._choose(min(count - len(victims), len(self._order)))
            for key in chosen:
                self.discard(key)
                self.forget(key)
                victims.append(key)
        return victims

    def __len__(self) -> int:
        return len(self._order)

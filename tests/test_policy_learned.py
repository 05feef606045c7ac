"""learned (LRB-style): labels only once known, determinism, and LRU order before training."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from kvsim.mrc import BlockSequence, replay
from kvsim.policies import make_policy
from kvsim.policies.base import BlockInfo, RequestHint
from kvsim.policies.learned import Learned, LearnedParams
from kvsim.traces import KIND_CODES


def _info(now: float, turn: int = 0) -> BlockInfo:
    return BlockInfo(now_s=now, hint=RequestHint(session=1, turn=turn, category="chat"))


def test_labels_come_only_after_the_boundary_or_the_reuse() -> None:
    """Boundary 10 s. Block 1 (sampled at 0 s) is never used again: its negative label appears
    only once the clock passes 10 s. Block 2 (sampled at 5 s) is hit at 6 s: positive then."""
    policy = Learned(LearnedParams(boundary_s=10.0, sample_every=1, min_samples=10**6))
    policy.add(1, _info(0.0))
    policy.add(2, _info(5.0))
    assert list(policy._y) == []
    policy.access(2, _info(6.0, turn=1))
    assert list(policy._y) == [1]
    policy.add(3, _info(9.9))
    assert list(policy._y) == [1]  # block 1's boundary has not passed yet
    policy.add(4, _info(10.5))
    assert list(policy._y) == [1, 0]
    # the negative sample carries what was known at 0 s: idle age 0, no past gap, no hits
    features = dict(zip(("category", "turn", "first", "tool", "position", "age", "gap", "hits"),
                        policy._x[1], strict=False))  # fmt: skip
    assert features["age"] == 0.0 and features["gap"] == -1.0 and features["hits"] == 0


def test_an_evicted_block_that_returns_in_time_is_positive() -> None:
    policy = Learned(LearnedParams(boundary_s=10.0, sample_every=1, min_samples=10**6))
    policy.add(1, _info(0.0))
    assert policy.evict(1) == [1]
    policy.miss(1, _info(4.0, turn=1))
    assert list(policy._y) == [1]


def _sessions(n_requests: int, seed: int = 0) -> BlockSequence:
    """Requests of 6 blocks: 3 from a small reused pool, 3 never seen again."""
    rng = np.random.default_rng(seed)
    keys, fresh = [], 10_000
    for _ in range(n_requests):
        keys += [int(k) for k in rng.integers(1, 40, size=3)]
        keys += list(range(fresh, fresh + 3))
        fresh += 3
    return BlockSequence(
        np.arange(0, 6 * n_requests + 1, 6, dtype=np.int64),
        np.array(keys, dtype=np.uint64),
        np.full(len(keys), KIND_CODES["user"], dtype=np.uint8),
        np.arange(n_requests, dtype=np.float64),
        16,
    )


def test_same_inputs_same_decisions() -> None:
    seq = _sessions(600)
    params = LearnedParams(min_samples=200, retrain_every=500, window=2000, max_iter=8)
    runs = []
    for _ in range(2):
        policy = Learned(params)
        log: list[list[int]] = []
        evict = policy.evict
        policy.evict = lambda n, evict=evict, log=log: log.append(evict(n)) or log[-1]  # type: ignore[method-assign]
        result = replay(seq, policy, 48)
        runs.append((result.hits, log, policy.retrains))
    assert runs[0] == runs[1]
    assert runs[0][2] > 0  # a model was trained and used


def test_lru_order_until_the_first_model() -> None:
    seq = _sessions(400)
    never = Learned(LearnedParams(min_samples=10**6))
    assert replay(seq, never, 48).hits == replay(seq, make_policy("lru"), 48).hits
    assert never.retrains == 0 and never.predict_calls == 0
    assert replay(seq, Learned(LearnedParams(min_samples=10**6)), 300, "prefix").hits == (
        replay(seq, make_policy("lru"), 300, "prefix").hits
    )

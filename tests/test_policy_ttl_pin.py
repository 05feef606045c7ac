"""ttl-pin: the learned continuation and gap, the TTL rule, expiry, fallbacks, a replay."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from kvsim.errors import ConfigError
from kvsim.kvcache.hints import TraceHints
from kvsim.mrc import BlockSequence, replay
from kvsim.policies.base import BlockInfo, RequestHint
from kvsim.policies.lru import LRU
from kvsim.policies.ttl_pin import TtlPin, TtlPinParams


def _info(now: float, hint: RequestHint | None, position: int = 0) -> BlockInfo:
    return BlockInfo(now_s=now, position=position, hint=hint)


def test_estimate_learns_continuation_and_gap() -> None:
    policy = TtlPin(TtlPinParams(prior_weight=1.0))
    later = RequestHint(session=7, turn=1, category="chat")
    policy.add(1, _info(0.0, later))  # session 7 released at 0
    policy.add(2, _info(0.0, RequestHint(session=8, turn=1, category="chat")))
    policy.miss(3, _info(6.0, RequestHint(session=7, turn=2, category="chat")))  # back after 6 s
    # session 8 was released with the prior gap 60 s: silent past 4 x 60 s, it has ended
    policy.miss(4, _info(250.0, RequestHint(session=9, turn=0, category="chat")))
    pi, gap = policy.estimate(later)
    assert pi == pytest.approx((1 + 0.5) / (1 + 1 + 1))  # one continued, one ended, prior 0.5
    assert gap == pytest.approx((6.0 + 60.0) / (1 + 1))  # gaps 6 s and the prior 60 s


def test_ttl_rule_worked_numbers() -> None:
    """pi 0.5 (prior), gap 2 s from the tool wait (rate 0.5/s); kappa = 5 hits / (10 blocks x
    10 s) = 0.05: the TTL is ln(0.5 x 0.45 / (0.05 x 0.5)) / 0.5 = 2 ln 9 = 4.394 s."""
    policy = TtlPin()
    policy.set_capacity(10)
    tool = RequestHint(session=1, turn=3, tool_wait_s=2.0)
    policy.miss(100, _info(0.0, None))
    assert policy.ttl(tool) == pytest.approx(8.0)  # no hits yet: the cap, 4 mean gaps
    for key in range(5):
        policy.access(key, _info(10.0, None))
    assert policy.kappa() == pytest.approx(0.05)
    assert policy.ttl(tool) == pytest.approx(2 * math.log(9))
    # lam pi <= kappa: not even a fresh block is worth its room
    assert policy.ttl(RequestHint(session=1, turn=3, tool_wait_s=20.0)) == 0.0


def test_pinned_blocks_go_last_until_their_ttl_runs_out() -> None:
    policy = TtlPin()
    policy.add(1, _info(0.0, RequestHint(session=1, turn=0, tool_wait_s=2.0)))  # TTL 8 s
    policy.add(2, _info(1.0, None))  # no hint: plain LRU
    assert policy.victim() == 2  # the pinned block is older but held
    policy.discard(2)
    policy.forget(2)
    policy.add(3, _info(9.0, None))
    # the TTL ran out at 8 s: block 1 ranks as if last used then, before block 3 (used at 9)
    assert policy.victim() == 1


@pytest.mark.parametrize(("capacity", "victim"), [(1, 3), (10, 2)])
def test_order_among_pins(capacity: int, victim: int) -> None:
    """Session 5 came back 10 s after its release; 3 blocks were released in 11 s. A 1-block
    tier fills in 11 / 3 = 3.7 s < 10 s: a fresh pin would be gone before its session came back,
    so the latest deadline goes first. A 10-block tier (36.7 s) evicts the earliest first."""
    policy = TtlPin()
    policy.set_capacity(capacity)
    tool = RequestHint(session=5, turn=0, tool_wait_s=2.0)
    policy.add(1, _info(0.0, tool))  # prior: pi 0.5, gap 2 s, no hits: TTL 4 x 2 = 8 s
    back = RequestHint(session=5, turn=1, tool_wait_s=2.0)
    policy.miss(50, _info(10.0, back))  # continued after 10 s
    # pi = (1 + 4 x 0.5) / (1 + 4) = 0.6, gap = (10 + 4 x 2) / (1 + 4) = 3.6 s: TTL 14.4 s
    assert policy.estimate(back) == pytest.approx((0.6, 3.6))
    policy.add(2, _info(10.0, back))  # deadline 24.4
    policy.add(3, _info(11.0, RequestHint(session=6, turn=0, tool_wait_s=2.0)))  # 25.4
    assert policy.victim() == 1  # its pin ran out at 8 s
    policy.discard(1)
    policy.forget(1)
    assert policy.fill_time() == pytest.approx(capacity * 11.0 / 3)
    assert policy.victim() == victim


def test_without_hints_it_is_lru() -> None:
    policy, lru = TtlPin(), LRU()
    rng = np.random.default_rng(3)
    for step in range(300):
        key = int(rng.integers(0, 40))
        info = _info(float(step), None, key % 5)
        if key in lru._stamp:
            policy.access(key, info)
            lru.access(key, info)
        else:
            if len(lru) >= 20:
                victim = lru.victim()
                assert policy.victim() == victim
                for p in (policy, lru):
                    p.discard(victim)
                    p.forget(victim)
            policy.add(key, info)
            lru.add(key, info)


def test_bad_params() -> None:
    with pytest.raises(ConfigError, match="prior_continue"):
        TtlPinParams(prior_continue=1.5)
    with pytest.raises(ConfigError, match="end_gaps"):
        TtlPinParams(end_gaps=0)


def _sequence(requests: list[tuple[float, int, int, list[int]]]) -> BlockSequence:
    """(arrival, session, turn, block keys) per request, 16-token blocks, full prompts."""
    keys = [k for *_, ks in requests for k in ks]
    offsets = np.cumsum([0] + [len(ks) for *_, ks in requests]).astype(np.int64)
    table = pa.table({
        "session_id": [s for _, s, _, _ in requests],
        "turn": [t for _, _, t, _ in requests],
        "category": ["chat"] * len(requests),
    })  # fmt: skip
    return BlockSequence(
        offsets, np.array(keys, dtype=np.uint64), np.zeros(len(keys), dtype=np.uint8),
        np.array([a for a, *_ in requests]), 16, np.diff(offsets) * 16, TraceHints(table),
    )  # fmt: skip


def test_replay_holds_a_returning_session_through_one_off_floods() -> None:
    """A chat session comes back every 10 s with its prompt grown by 2 blocks; between its turns
    five one-off requests of 6 blocks each flush a 24-block tier. LRU loses the session's prefix
    every time; ttl-pin learns that later turns come back (and one-offs do not) and holds it."""
    requests, fresh = [], 1000
    for k in range(30):
        t = 10.0 * k
        requests.append((t, 0, k, list(range(1, 2 * (k % 8) + 3))))
        for j in range(5):
            requests.append((t + 1 + j, 100 + 5 * k + j, 0, list(range(fresh, fresh + 6))))
            fresh += 6
    seq = _sequence(requests)
    lru = replay(seq, LRU(), 24, "prefix").hits
    ttl = replay(seq, TtlPin(), 24, "prefix").hits
    assert lru == 0
    assert ttl > 100

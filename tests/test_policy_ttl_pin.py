"""ttl-pin: the learned continuation and gap, the TTL rule, expiry, fallbacks, a replay."""

from __future__ import annotations

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


def test_hold_rate_worked_numbers() -> None:
    """Four chat sessions came back after 3 s each, none ended: pi = (4 + 4 x 0.5) / (4 + 4) =
    0.75; the gap histogram holds the four 3 s gaps and the prior's 4 pseudo-gaps of 60 s. A pin
    of 4 s sees half the mass back (mean 3 s): r(4) = 0.75 x 0.5 / (0.75 x (12 + 4 x 4) / 8 +
    0.25 x 4) = 0.10345 hits per block-second; a pin of 2 s sees nothing back."""
    policy = TtlPin()
    for session in range(4):
        policy.add(session, _info(0.0, RequestHint(session=session, turn=1, category="chat")))
        policy.miss(100 + session, _info(3.0, RequestHint(session=session, turn=2,
                                                          category="chat")))  # fmt: skip
    later = RequestHint(session=9, turn=1, category="chat")
    assert policy.estimate(later) == pytest.approx((0.75, (12 + 4 * 60) / 8))
    assert policy.hold_rates(later, [2.0, 4.0]) == pytest.approx([0.0, 0.375 / 3.625])


def test_pins_their_ttl_and_order() -> None:
    """A 2-block tier. Blocks 1, 2 released at 0 (the tier has not filled: no pin). At 1 s the
    tier has taken 2 blocks in 1 s (fill time 1 s); a tool call expected back in 2 s (prior:
    pi 0.5, all mass at 2 s) earns r(T) = 0.5 / (0.5 x 2 + 0.5 T) for T >= 2, 0 below, and
    LRU's 1 s hold earns 0: TTL 2 s. Blocks 3 (deadline 3 s) and 5 (at 1.2 s: deadline 3.2 s)
    are pinned; block 4 (no hint, at 1.5 s) is not."""
    policy = TtlPin()
    policy.set_capacity(2)
    policy.add(1, _info(0.0, RequestHint(session=1, turn=0, tool_wait_s=2.0)))
    policy.add(2, _info(0.0, RequestHint(session=1, turn=0, tool_wait_s=2.0)))
    tool = RequestHint(session=2, turn=0, tool_wait_s=2.0)
    policy.add(3, _info(1.0, tool))
    assert policy.fill_time() == pytest.approx(1.0)
    assert policy.ttl(tool) == 2.0
    policy.add(5, _info(1.2, RequestHint(session=3, turn=0, tool_wait_s=2.0)))
    policy.add(4, _info(1.5, None))
    assert policy.evict(3) == [1, 2, 4]  # unpinned first, oldest first, though 3 and 5 are older
    assert policy.victim() == 5  # only live pins left: the latest deadline goes first
    policy.add(6, _info(3.1, None))
    assert policy.victim() == 3  # its TTL ran out at 3 s: as if last used then, before 6


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


def _victims(seq: BlockSequence, capacity: int) -> list[tuple[int, ...]]:
    policy = TtlPin()
    chosen: list[tuple[int, ...]] = []
    evict = policy.evict

    def recording(count: int) -> list[int]:
        out = evict(count)
        chosen.append(tuple(out))
        return out

    policy.evict = recording  # type: ignore[method-assign]
    replay(seq, policy, capacity, "prefix")
    return chosen

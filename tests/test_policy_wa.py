"""wa: the per-class fits, the victim they choose, head before tail, fallbacks, a replay."""

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
from kvsim.policies.wa import WorkloadAware, WorkloadAwareParams

CHAT = RequestHint(session=1, turn=0, category="chat")
API = RequestHint(session=2, turn=0, category="api")


def _info(now: float, hint: RequestHint | None, position: int = 0) -> BlockInfo:
    return BlockInfo(now_s=now, position=position, hint=hint)


def _two_categories(min_effect: float = 0.0) -> WorkloadAware:
    """Chat blocks 1 and 2 released at 0; block 1 hit at 5 (a reuse after 5 s). At 30 both have
    idled past the horizon (2 mean gaps of the prior 10 s = 20 s): censored. Then an api block
    (3) at 30 and a chat block (4) at 30.5."""
    params = WorkloadAwareParams(
        depth_edges=(), prior_weight=0.0, prior_mean_gap_s=10.0, ghost_gaps=2.0,
        refresh_every=1, min_effect=min_effect,
    )  # fmt: skip
    policy = WorkloadAware(params)
    policy.set_capacity(8)
    policy.add(1, _info(0.0, CHAT))
    policy.add(2, _info(0.0, CHAT))
    policy.access(1, _info(5.0, CHAT))
    policy.add(3, _info(30.0, API))
    policy.add(4, _info(30.5, CHAT))
    return policy


def test_fit_from_reuses_and_censored_episodes() -> None:
    policy = _two_categories()
    chat_first = 0  # (category 'chat' first seen, first turn, the one position class)
    # one reuse after 5 s, two episodes censored: pi = 1/3, rate = 1 / 5 s
    assert policy.reuse_probability(chat_first, 0.0) == pytest.approx(1 / 3)
    assert policy.reuse_probability(chat_first, 5.0) == pytest.approx(1 / (1 + 2 * math.e))
    # the pooled fit, which a new class starts from: odds (1 + 1) / (2 + 1), rate 2 / (5 + 10)
    api_first = 3
    assert policy.reuse_probability(api_first, 0.0) == pytest.approx(0.4)
    assert policy.reuse_probability(api_first, 7.5) == pytest.approx(1 / (1 + 1.5 * math.e))


def test_small_class_differences_are_noise() -> None:
    """The chat class differs from the pooled fit by ln(0.5 / (2/3)) = -0.29 in log-odds and
    ln(0.2 / (2/15)) = 0.41 in log-rate, both within min_effect 0.5: it keeps the pooled fit."""
    policy = _two_categories(min_effect=0.5)
    assert policy.reuse_probability(0, 0.0) == pytest.approx(0.4)
    assert policy.reuse_probability(0, 7.5) == pytest.approx(1 / (1 + 1.5 * math.e))
    assert policy.evict(4) == [2, 1, 3, 4]  # one fit for all: LRU order


def test_victims_by_reuse_probability_not_recency() -> None:
    """Log-odds at 30.5 s: block 2 ln 0.5 - 0.2 x 30.5 = -6.79, block 1 -0.69 - 0.2 x 25.5 =
    -5.79, block 4 (chat, fresh) -0.69, block 3 (api, 0.5 s old) ln(2/3) - 0.5 x 2/15 = -0.47:
    the older api block outlives the fresh chat block, which LRU would keep."""
    policy = _two_categories()
    assert policy.evict(4) == [2, 1, 4, 3]
    with pytest.raises(LookupError):
        policy.victim()


def test_batch_evict_equals_one_by_one() -> None:
    one, batch = _two_categories(), _two_categories()
    singles = []
    for _ in range(3):
        key = one.victim()
        one.discard(key)
        one.forget(key)
        singles.append(key)
    assert batch.evict(3) == singles


def test_a_deeper_block_never_outranks_its_head() -> None:
    """Tail blocks (position >= 1) reused more often than heads still rank at most as high:
    a tail block serves no hit once its head is gone."""
    params = WorkloadAwareParams(depth_edges=(1,), prior_weight=0.0, prior_mean_gap_s=10.0,
                                 ghost_gaps=2.0, refresh_every=1, min_effect=0.0)  # fmt: skip
    policy = WorkloadAware(params)
    policy.add(1, _info(0.0, CHAT, 0))  # the head: never reused, censored at 20 s
    policy.add(2, _info(0.0, CHAT, 1))  # a tail block: reused at 2 s, idle from 2 s
    policy.access(2, _info(2.0, CHAT, 1))
    policy.add(3, _info(25.0, CHAT, 0))
    head, tail = 0, 1
    assert policy.reuse_probability(tail, 0.0) <= policy.reuse_probability(head, 0.0)
    assert policy.reuse_probability(tail, 3.0) <= policy.reuse_probability(head, 3.0)


def test_without_hints_and_evidence_it_is_lru() -> None:
    policy, lru = WorkloadAware(WorkloadAwareParams(refresh_every=10**9)), LRU()
    rng = np.random.default_rng(5)
    for step in range(400):
        key = int(rng.integers(0, 40))
        info = _info(float(step // 3), None, key % 7)
        if key in lru._stamp:
            policy.access(key, info)
            lru.access(key, info)
            continue
        if len(lru) >= 20:
            victim = lru.victim()
            assert policy.victim() == victim
            for p in (policy, lru):
                p.discard(victim)
                p.forget(victim)
        policy.add(key, info)
        lru.add(key, info)


def test_bad_params() -> None:
    with pytest.raises(ConfigError, match="depth_edges"):
        WorkloadAwareParams(depth_edges=(4, 1))
    with pytest.raises(ConfigError, match="ghost_gaps"):
        WorkloadAwareParams(ghost_gaps=0)


def _sequence(requests: list[tuple[float, str, list[int]]]) -> BlockSequence:
    """(arrival, category, block keys) per single-turn request, 16-token blocks."""
    keys = [k for *_, ks in requests for k in ks]
    offsets = np.cumsum([0] + [len(ks) for *_, ks in requests]).astype(np.int64)
    table = pa.table({
        "session_id": list(range(len(requests))),
        "turn": [0] * len(requests),
        "category": [c for _, c, _ in requests],
    })  # fmt: skip
    return BlockSequence(
        offsets, np.array(keys, dtype=np.uint64), np.zeros(len(keys), dtype=np.uint8),
        np.array([a for a, *_ in requests]), 16, np.diff(offsets) * 16, TraceHints(table),
    )  # fmt: skip


def test_replay_keeps_the_api_prompt_through_one_off_chats() -> None:
    """Every second an api request sends the shared 2-block system prompt and one block of its
    own; then two one-off chats send 4 blocks each. In an 8-block tier LRU evicts the prompt for
    the second chat every time (no hit at all); wa learns within ten requests that api heads come
    back within a second and chat blocks never do, and from then on keeps the prompt (2 hits per
    api request: the hit stops one token short of the 3-block prompt)."""
    requests, fresh = [], 1000
    for i in range(200):
        requests.append((float(i), "api", [1, 2, fresh]))
        requests.append((i + 0.3, "chat", list(range(fresh + 1, fresh + 5))))
        requests.append((i + 0.6, "chat", list(range(fresh + 5, fresh + 9))))
        fresh += 10
    seq = _sequence(requests)
    assert replay(seq, LRU(), 8, "prefix").hits == 0
    wa = replay(seq, WorkloadAware(), 8, "prefix").request_hits
    assert wa[30::3].tolist() == [2] * 190
    assert wa[1::3].sum() == wa[2::3].sum() == 0


def _victims(seq: BlockSequence, capacity: int) -> list[tuple[int, ...]]:
    policy = WorkloadAware()
    chosen: list[tuple[int, ...]] = []
    evict = policy.evict

    def recording(count: int) -> list[int]:
        out = evict(count)
        chosen.append(tuple(out))
        return out

    policy.evict = recording  # type: ignore[method-assign]
    replay(seq, policy, capacity, "prefix")
    return chosen

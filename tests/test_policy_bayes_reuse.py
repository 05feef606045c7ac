"""bayes-reuse (the redesign on request metadata): posteriors, P(reuse), cost-aware value and
the fall-back to recency, on hand-built states with the numbers worked out."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from kvsim.errors import ConfigError
from kvsim.policies import make_policy
from kvsim.policies.base import BlockInfo, RequestHint
from kvsim.policies.bayes_reuse import BayesReuse, BayesReuseParams

# Two age bins, [0, 1) s and [1, inf) treated as 1 s wide; a 1 s horizon; a uniform Beta(1, 1)
# prior for the pooled hazard and 2 pseudo-episodes of the pool in each class's prior.
SMALL = BayesReuseParams(
    horizon_s=1.0, age_base_s=1.0, age_bins=2, prior_alpha=1.0, prior_beta=1.0,
    class_strength=2.0, refresh_every=1, margin=0.0, margin_abs=0.0, proportional=False,
)  # fmt: skip
CHAT0 = RequestHint(session=7, turn=0, category="chat")


def _info(now: float, hint: RequestHint | None = None, **kw: float) -> BlockInfo:
    info = BlockInfo(now_s=now, hint=hint)
    for name, value in kw.items():
        setattr(info, name, value)
    return info


def test_posterior_and_reuse_probability_worked() -> None:
    """One class: in bin 0, 3 episodes reused and 1 outlived it; nothing known of bin 1.

    Pooled (only this class): hazards (3+1)/(4+2) = 2/3 and (0+1)/(0+2) = 1/2. The class, with
    2 pseudo-episodes of the pool: (3 + 2·2/3)/(4+2) = 13/18 and (0 + 2·1/2)/(0+2) = 1/2.
    P(reuse within 1 s) from the middle of bin 0 (0.5 s): 1 − exp(−(0.5·ln(18/5) + 0.5·ln 2))
    = 1 − sqrt(5/36) = 0.62732; from bin 1: 1 − 1/2 (below bin 0's, so the envelope keeps it)."""
    policy = BayesReuse(SMALL)
    cls = policy.class_of(_info(0.0, CHAT0), 0)
    assert cls == 16  # category 'chat' is 1 (0 is unknown), turn bucket 0, gap 'new'
    for _ in range(3):
        policy._outcome(cls, 0, True)
    policy._outcome(cls, 0, False)
    assert policy.reuse_probability(cls, 0.2) == pytest.approx(1 - math.sqrt(5 / 36))
    assert policy.reuse_probability(cls, 7.0) == pytest.approx(0.5)
    # a class with no episodes follows the pool: 1 − sqrt(1/3 · 1/2), then 1/2
    other = policy.class_of(_info(0.0, RequestHint(session=8, turn=5, category="api")), 0)
    assert policy.reuse_probability(other, 0.2) == pytest.approx(1 - math.sqrt(1 / 6))
    assert policy.reuse_probability(other, 7.0) == pytest.approx(0.5)
    # proportional (the default): the class scales the pooled profile by its P at age 0
    prop = BayesReuse(dataclasses.replace(SMALL, proportional=True))
    assert prop.class_of(_info(0.0, CHAT0), 0) == cls
    for _ in range(3):
        prop._outcome(cls, 0, True)
    prop._outcome(cls, 0, False)
    ratio = (1 - math.sqrt(5 / 36)) / (1 - math.sqrt(1 / 6))  # 1.06010
    assert prop.reuse_probability(cls, 0.2) == pytest.approx(1 - math.sqrt(5 / 36))
    assert prop.reuse_probability(cls, 7.0) == pytest.approx(0.5 * ratio)


def test_a_class_clearly_less_reused_leaves_first() -> None:
    """'api' blocks were never reused, 'chat' ones always: the newer api block goes before the
    older chat block, against recency."""
    policy = BayesReuse(SMALL)
    chat = policy.class_of(_info(0.0, CHAT0), 0)
    api = policy.class_of(_info(0.0, RequestHint(session=9, turn=0, category="api")), 0)
    for _ in range(20):
        policy._outcome(chat, 0, True)
        policy._outcome(api, 0, False)
    policy.add(1, _info(0.0, RequestHint(session=1, turn=0, category="chat")))
    policy.add(2, _info(0.1, RequestHint(session=2, turn=0, category="api")))
    assert policy.victim() == 2


def test_value_weighs_the_tier_below() -> None:
    """Same class and P: value = P × min(recompute_s, lower_load_s) / bytes. Block 1 (recompute
    2 s, reloaded from below in 0.1 s) is worth 0.1·P; block 2 (recompute 0.5 s, nothing below)
    0.5·P: block 1 goes first although block 2 is older."""
    policy = BayesReuse(SMALL)
    policy.add(2, _info(0.0, CHAT0, recompute_s=0.5))
    policy.add(1, _info(0.0, CHAT0, recompute_s=2.0, lower_load_s=0.1, position=1))
    assert policy._meta[1][2] == pytest.approx(0.1)
    assert policy._meta[2][2] == pytest.approx(0.5)
    assert policy.victim() == 1
    # nothing known: cost 1 per byte; a 4-byte block with a 2 s recompute: 0.5 per byte
    assert BayesReuse._cost(BlockInfo()) == 1.0
    assert BayesReuse._cost(BlockInfo(size_bytes=4, recompute_s=2.0)) == 0.5


def test_without_hints_or_evidence_it_is_lru() -> None:
    """No hint and nothing learned: the order is recency, deepest first among blocks released
    together, exactly as LRU's."""
    policy, lru = BayesReuse(), make_policy("lru")
    steps = [(0.0, [3, 2, 1]), (1.0, [6, 5, 4]), (2.0, [9, 8, 7])]
    for now, keys in steps:
        for p in (policy, lru):
            p.add_many(keys, [2, 1, 0], [0, 0, 0], BlockInfo(now_s=now))
    for p in (policy, lru):  # a hit on block 2 pins it; released again at 3 s
        p.access(2, BlockInfo(now_s=3.0, position=1))
        p.discard(2)
        p.add(2, BlockInfo(now_s=3.0, position=1))
    assert policy.evict(9) == lru.evict(9) == [3, 1, 6, 5, 4, 9, 8, 7, 2]


def test_episodes_survive_bins_return_as_reuses_and_stop_when_forgotten() -> None:
    """Bins [0, 1), [1, 2), [2, 4), [4, inf) s. Block 1, evicted at 0 s, is missed at 2.5 s: it
    outlived bins 0 and 1 and was reused in bin 2. Block 2, evicted at 3 s, is still idle at
    20 s (outlived bins 0–2 at 4, 5 and 7 s); its ghost, older than 4 horizons, is forgotten
    then, and its episode stops without an outcome in bin 3."""
    params = BayesReuseParams(horizon_s=1.0, age_base_s=1.0, age_bins=4, ghost_horizons=4.0)
    policy = BayesReuse(params)
    cls = policy.class_of(_info(0.0, CHAT0), 0)
    policy.add(1, _info(0.0, CHAT0))
    assert policy.evict(1) == [1]
    policy.miss(1, _info(2.5, CHAT0))
    assert policy.survived[cls] == [1, 1, 0, 0] and policy.reuses[cls] == [0, 0, 1, 0]
    policy.add(2, _info(3.0, CHAT0))
    assert policy.evict(1) == [2]
    policy.add(3, _info(20.0, CHAT0))
    assert policy.survived[cls] == [2, 2, 1, 0] and 2 in policy._episodes
    policy.evict(1)
    assert 2 not in policy._episodes and policy.reuses[cls] == [0, 0, 1, 0]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [({"margin": 1.0}, "'margin' must be in [0, 1)"),
     ({"turn_edges": [4, 2, 1]}, "'turn_edges' must be non-decreasing"),
     ({"class_strength": 0}, "'class_strength' must be in (0, 1e9]")],
)  # fmt: skip
def test_parameters_out_of_range(params: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        make_policy("bayes-reuse", params)

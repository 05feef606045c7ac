"""ema-head: head groups of old blocks leave first; attention mass lost is reported honestly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.errors import ConfigError
from kvsim.mrc import BlockSequence, replay
from kvsim.policies import BlockInfo, make_policy
from kvsim.policies.ema_head import EmaHead, EmaHeadParams, HeadProfile
from kvsim.traces import KIND_CODES


def _requests(chains: list[list[int]], times: list[float], tail: int = 0) -> BlockSequence:
    """Requests of these block chains; `tail` tokens past the full blocks (with 1, the
    input - 1 cap leaves every full block hittable)."""
    keys = [k for chain in chains for k in chain]
    offsets = np.cumsum([0] + [len(c) for c in chains]).astype(np.int64)
    return BlockSequence(
        offsets,
        np.array(keys, dtype=np.uint64),
        np.full(len(keys), KIND_CODES["user"], dtype=np.uint8),
        np.array(times, dtype=np.float64),
        16,
        np.array([16 * len(c) + tail for c in chains], dtype=np.int64),
    )


def test_profile_is_a_distribution_per_head() -> None:
    profile = HeadProfile(EmaHeadParams(head_groups=4, retrieval_groups=1))
    per_block = [profile.attention(p, 50) for p in range(50)]
    for group in range(4):
        assert math.isclose(sum(a[group] for a in per_block), 1.0)
    assert per_block[0][0] == per_block[25][0]  # retrieval: even over the context
    assert per_block[48][1] > per_block[25][1]  # local: recent blocks matter more
    assert per_block[0][1] > per_block[1][1]  # streaming: the attention sink


def test_old_blocks_go_first_whole_block() -> None:
    policy = make_policy("ema-head")
    info = BlockInfo(now_s=0.0, request_tokens=64)
    for position, key in enumerate((1, 2, 3, 4)):
        policy.add(key, info.at(key, position, key - 1))
    info = BlockInfo(now_s=10.0, request_tokens=64)
    for position, key in enumerate((11, 12, 13, 14)):
        policy.add(key, info.at(key, position, key - 1 if position else 0))
    assert policy.victim() in (1, 2, 3, 4)


def test_unimportant_groups_of_old_blocks_go_first() -> None:
    """Head-granular: one group short of room, the group evicted is a local head's group of
    the old request's far block, and a later hit on that block loses a small attention share."""
    chain_a, chain_b = list(range(1, 9)), list(range(101, 109))
    seq = _requests([chain_a, chain_b, chain_a], [0.0, 10.0, 20.0], tail=1)
    params = EmaHeadParams(tolerate_loss=1.0)
    lossless = replay(seq, EmaHead(EmaHeadParams()), 17, "prefix")
    assert lossless.hits == 8 and lossless.extra["attention_mass_lost"] == 0.0
    # 64 group slots: 8 blocks cached + 9 blocks (a partial one) running need 68
    tight = replay(seq, EmaHead(params), 16, "prefix")
    assert tight.hits == 8 and tight.extra["lossy_hits"] > 0
    lost = tight.extra["attention_mass_lost"]
    assert 0 < lost < 0.05  # local groups of far blocks hold little attention
    strict = replay(seq, EmaHead(EmaHeadParams()), 16, "prefix")
    assert strict.hits < 8 and strict.extra["lossy_hits"] == 0


def test_no_partial_eviction_no_loss() -> None:
    seq = _requests([[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5]], [0.0, 1.0, 2.0], tail=1)
    for tolerate in (0.0, 0.5):
        result = replay(seq, EmaHead(EmaHeadParams(tolerate_loss=tolerate)), 10, "prefix")
        assert result.hits == 3 + 4
        assert result.extra == {
            "attention_mass_lost": 0.0,
            "lossy_hits": 0,
            "unserved_requests": 0,
        }


def test_whole_block_mode_matches_the_engine_order() -> None:
    seq = _requests([[1, 2, 3], [4, 5, 6], [1, 2, 3]], [0.0, 5.0, 10.0])
    whole = replay(seq, EmaHead(EmaHeadParams(head_granular=False)), 5, "prefix")
    assert "attention_mass_lost" not in (whole.extra or {}) and whole.hits >= 1


def test_bad_params_are_rejected() -> None:
    with pytest.raises(ConfigError, match="retrieval_groups"):
        EmaHead(EmaHeadParams(head_groups=2, retrieval_groups=3))

"""Cache semantics of the engine-named policies: hand-built streams where the engine's order
matters, worked out by hand, and the cache-only replay against the engine itself.

Block size 16 throughout. Unless a test says otherwise a prompt is its full blocks plus one
token, so the last, partial block is allocated (and freed uncached) and the input - 1 cap never
bites: a request of n full blocks holds n + 1 blocks while it runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import Req, make_trace

from kvsim.engine import EngineConfig, simulate
from kvsim.hardware import load_profile
from kvsim.kvcache.block_pool import BlockPool
from kvsim.models import load_model
from kvsim.mrc import BlockSequence, replay
from kvsim.policies import BlockInfo, make_policy
from kvsim.policies.sglang import SGLang
from kvsim.traces import KIND_CODES

BS = 16


def _stream(chains: list[list[int]], tokens: list[int] | None = None) -> BlockSequence:
    keys = [k for chain in chains for k in chain]
    offsets = np.cumsum([0] + [len(c) for c in chains]).astype(np.int64)
    if tokens is None:
        tokens = [len(c) * BS + 1 for c in chains]
    return BlockSequence(
        offsets,
        np.array(keys, dtype=np.uint64),
        np.full(len(keys), KIND_CODES["user"], dtype=np.uint8),
        np.arange(len(chains), dtype=np.float64),
        BS,
        np.array(tokens, dtype=np.int64),
    )


def _hits(policy: str, seq: BlockSequence, capacity: int) -> list[int]:
    result = replay(seq, make_policy(policy), capacity, "prefix")
    assert result.request_hits is not None
    assert result.hits == int(result.request_hits.sum())
    return result.request_hits.tolist()


A, B = [1, 2, 3], [10]


@pytest.mark.parametrize("policy", ["vllm", "lru", "radix-lru"])
def test_deepest_first_release_keeps_the_chain_head(policy: str) -> None:
    """Capacity 4. R1 = a0 a1 a2 (4 blocks with its partial one). Released deepest first, the
    LRU order is a2, a1, a0 and one block is left free. R2 = b0 needs 2 blocks: the free one
    and one eviction, a2 (the tail). R3 = a0 a1 a2 hits a0 a1: 2 blocks.

    The old replay touched a request's blocks shallowest first and never released them, so
    its LRU end held a0: evicting the head stranded a1 and a2, and R3 hit nothing."""
    seq = _stream([A, B, A])
    assert _hits(policy, seq, 4) == [0, 0, 2]


def test_sglang_evicts_the_whole_node() -> None:
    """Capacity 6. R1 = a0..a3 (5 blocks held) leaves one radix node A = [a0..a3] and 2 free
    blocks. R2 = b0 needs 2: both free; node B = [b0], 1 block free. R3 = c0 needs 2: 1 free,
    shortfall 1. SGLang's least recently used leaf is A, and it goes whole: 4 blocks for a
    shortfall of 1 (3 over), so R4 = a0..a3 hits nothing. R4 needs 5 of the 4 free: one more
    node goes, the older leaf B, so R5 = b0 misses too.

    vLLM under the same stream evicts only a3 for R3 (deepest first), so R4 hits a0 a1 a2 = 3;
    R4 then needs 2 blocks: 1 free and one eviction, b0 (the oldest left); R5 misses."""
    chains = [[1, 2, 3, 4], [10], [20], [1, 2, 3, 4], [10]]
    seq = _stream(chains)
    assert _hits("sglang", seq, 6) == [0, 0, 0, 0, 0]
    assert _hits("vllm", seq, 6) == [0, 0, 0, 3, 0]


def test_sglang_node_splits_where_a_request_diverges() -> None:
    """Capacity 7. R1 = a0 a1 a2 (node [a0 a1 a2], 3 of 7 cached, 4 free). R2 = a0 d1 diverges
    after a0: its hit (a0) splits the node into [a0] -> [a1 a2], and d1 becomes node [d1]
    under [a0]. Cached: a0 a1 a2 d1, 3 free. R3 = e0 e1 e2 needs 4: 3 free, shortfall 1. The
    leaves are [a1 a2] (touched by R2's match, which split it) and [d1] (inserted after it):
    [a1 a2] goes whole, 2 blocks. R4 = a0 d1 hits both: 2. Without the split, R2's path
    would be one node and could not lose [a1 a2] alone."""
    chains = [[1, 2, 3], [1, 40], [50, 51, 52], [1, 40]]
    assert _hits("sglang", _stream(chains), 7) == [0, 1, 0, 2]


@pytest.mark.parametrize("policy", ["vllm", "sglang", "radix-lru"])
def test_hit_is_capped_at_input_minus_one_token(policy: str) -> None:
    """Both engines compute at least the prompt's last token. R1 = a0 a1 with 32 tokens (two
    full blocks exactly). R2, the same 32 tokens: the hit may cover (32 - 1) // 16 = 1 block,
    not 2. R3 = a0 a1 a2 with 49 tokens: limit (49 - 1) // 16 = 3, a0 a1 cached: 2. R4 = a0 a1
    with 33 tokens: limit (33 - 1) // 16 = 2: 2."""
    seq = _stream([[1, 2], [1, 2], [1, 2, 3], [1, 2]], tokens=[32, 32, 49, 33])
    assert _hits(policy, seq, 100) == [0, 1, 2, 2]


def test_sglang_in_a_pool_frees_what_it_over_evicts() -> None:
    """The pool takes every block the policy gives up: asked for 1, SGLang gives 3, and the
    2 extra become free blocks."""
    pool = BlockPool(4, SGLang())
    chain = [1, 2, 3]
    assert pool.allocate(4)
    assert pool.register(chain, 0, 3, 0.0) == [0, 1, 2]
    pool.release(chain, [0, 1, 2], 1, 0.0)
    assert pool.free_uncached == 1 and len(pool.policy) == 3
    assert pool.allocate(2)
    assert pool.free_uncached == 2 and pool.refs == {} and pool.stats.evictions == 3
    pool.check()


def test_sglang_victim_is_the_deepest_block_of_the_oldest_leaf() -> None:
    policy = SGLang()
    info = BlockInfo()
    policy.add_many([3, 2, 1], [2, 1, 0], [2, 1, 0], info)  # node [1 2 3]
    policy.add_many([11], [0], [0], info)  # node [11], newer
    assert policy.victim() == 3
    assert policy.evict(1) == [1, 2, 3]
    assert len(policy) == 1 and policy.victim() == 11


# -- the cache-only replay is the engine ------------------------------------------------------
MODEL = load_model("llama-3.1-8b")
PROFILE = load_profile("h100-sxm")


def _overlapping_prompts(n: int, seed: int) -> list[Req]:
    """Conversations over a few system prompts, spaced so that no two requests overlap."""
    rng = np.random.default_rng(seed)
    systems = [(1000 + s, int(rng.integers(20, 120))) for s in range(4)]
    history: dict[int, list[tuple[int, int]]] = {}
    reqs = []
    for i in range(n):
        session = int(rng.integers(0, 12))
        prompt = history.get(session) or [systems[session % 4]]
        prompt = [*prompt, (10_000 + i, int(rng.integers(5, 90)))]
        history[session] = prompt if rng.random() < 0.8 else []
        reqs.append(Req(prompt, output_tokens=1, arrival_s=1000.0 * i))
    return reqs


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_engine_with_one_sequence_equals_the_prefix_replay(policy: str) -> None:
    """`max_num_seqs` 1 and requests that never overlap: the engine's per-request hits are
    those of `kvsim mrc --semantics prefix`, request for request, with evictions happening."""
    trace = make_trace(_overlapping_prompts(150, seed=3))
    blocks = 60
    config = EngineConfig(
        policy=policy, num_gpu_blocks=blocks, max_num_seqs=1, max_num_batched_tokens=8192
    )
    engine = simulate(trace, MODEL, PROFILE, config).requests.to_pydict()["cached_tokens"]
    seq = BlockSequence.from_trace(trace, BS)
    result = replay(seq, make_policy(policy), blocks, "prefix")
    assert result.request_hits is not None
    assert [h * BS for h in result.request_hits.tolist()] == engine
    assert sum(engine) > 0
    assert int(seq.keys.size) - result.hits > 2 * blocks  # the cache did evict

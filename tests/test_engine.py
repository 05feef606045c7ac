"""Engine checks: closed forms, vLLM prefix-cache mechanics, invariants under random workloads."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from helpers import Req, make_trace, same_table, unless_compiled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.costmodel import make_cost_model
from kvsim.engine import EngineConfig, simulate
from kvsim.engine import scheduler as scheduler_module
from kvsim.hardware import load_profile
from kvsim.models import load_model
from kvsim.policies import builtin_policy_names

MODEL = load_model("llama-3.1-8b")
PROFILE = load_profile("h100-sxm")


def run(reqs, **engine):
    config = EngineConfig(**engine)
    result = simulate(make_trace(reqs), MODEL, PROFILE, config)
    return result, result.requests.to_pydict()


def test_lone_request_ttft_equals_prefill_time():
    cost = make_cost_model(MODEL, PROFILE)
    _, rows = run([Req([(1, 3000)], output_tokens=1)])
    front_end = cost.request_overhead_s  # API server and tokenisation, before the queue
    assert rows["ttft_s"][0] == pytest.approx(cost.prefill_time_s(3000) + front_end, rel=1e-12)


def test_lone_request_chunked_prefill_sums_chunks():
    cost = make_cost_model(MODEL, PROFILE)
    _, rows = run([Req([(1, 5000)], output_tokens=1)], max_num_batched_tokens=2048)
    expected = cost.prefill_time_s(5000, chunk=2048)
    assert rows["ttft_s"][0] == pytest.approx(expected + cost.request_overhead_s, rel=1e-12)
    # three chunks cost more than one pass of the same tokens: each re-reads the weights
    assert expected > cost.prefill_time_s(5000)


def test_lone_request_e2e_is_prefill_plus_decode_steps():
    cost = make_cost_model(MODEL, PROFILE)
    _, rows = run([Req([(1, 1000)], output_tokens=50)])
    decode = cost.decode_run_ends_s(np.array([1000.0]), 49)[-1]
    e2e = cost.request_overhead_s + cost.prefill_time_s(1000) + decode
    assert rows["e2e_s"][0] == pytest.approx(e2e, rel=1e-9)
    assert rows["tpot_s"][0] == pytest.approx(decode / 49, rel=1e-9)


def test_repeated_prompt_hits_every_full_block():
    prompt = [(7, 100), (8, 1000)]  # 1100 tokens: 68 full blocks of 16, 12 tokens left over
    _, rows = run([Req(prompt, 5, arrival_s=0.0), Req(prompt, 5, arrival_s=100.0)])
    assert rows["cached_tokens"] == [0, 68 * 16]


def test_whole_prompt_hit_still_computes_last_block():
    prompt = [(7, 1024)]  # 64 full blocks; vLLM recomputes the last one to sample a token
    _, rows = run([Req(prompt, 5, arrival_s=0.0), Req(prompt, 5, arrival_s=100.0)])
    assert rows["cached_tokens"][1] == 63 * 16


def test_next_turn_reuses_generated_tokens():
    first = Req([(1, 500)], 300, session_id=9, turn=0, output_hash=77)
    second = Req([(1, 500), (77, 300), (3, 40)], 10, session_id=9, turn=1, think_time_s=5.0)
    _, rows = run([first, second])
    # prompt + reply = 800 tokens; only tokens whose KV was computed count (the last reply
    # token's KV never is), so 799 computed tokens -> 49 full blocks
    assert rows["cached_tokens"][1] == 49 * 16
    assert rows["arrival_s"][1] == pytest.approx(rows["finish_s"][0] + 5.0)


def test_prefix_caching_off_hits_nothing():
    prompt = [(7, 2000)]
    _, rows = run([Req(prompt, 5), Req(prompt, 5, arrival_s=50.0)], enable_prefix_caching=False)
    assert rows["cached_tokens"] == [0, 0]


def test_deepest_blocks_are_evicted_first():
    # pool of 10 blocks; A (8 blocks) finishes, then B (unrelated, 4 blocks) needs 2 evictions:
    # LRU over the deepest-first release order takes A's last two blocks, so A's first 6 survive
    a = Req([(1, 128)], 1, arrival_s=0.0)
    b = Req([(2, 64)], 1, arrival_s=10.0)
    a_again = Req([(1, 128)], 1, arrival_s=20.0)
    _, rows = run([a, b, a_again], num_gpu_blocks=10)
    assert rows["cached_tokens"][2] == 6 * 16


def test_preemption_recomputes_and_everything_completes():
    reqs = [Req([(i + 1, 300)], 400, arrival_s=0.0) for i in range(6)]
    _result, rows = run(reqs, num_gpu_blocks=80)
    assert sum(rows["preemptions"]) > 0
    assert rows["status"] == ["completed"] * 6
    assert sum(rows["recomputed_tokens"]) > 0


def test_request_larger_than_cache_is_rejected():
    _, rows = run([Req([(1, 2000)], 10), Req([(2, 100)], 10)], num_gpu_blocks=50)
    assert rows["status"] == ["rejected", "completed"]


def test_coalesced_decode_matches_step_by_step():
    rng = np.random.default_rng(3)
    reqs = [
        Req(
            [(int(rng.integers(1, 5)), int(rng.integers(50, 900)))],
            int(rng.integers(1, 300)),
            arrival_s=float(rng.uniform(0, 3)),
        )
        for _ in range(40)
    ]
    _, fast = run(reqs, num_gpu_blocks=600)
    _, slow = run(reqs, num_gpu_blocks=600, coalesce_decode=False)
    for key in ("ttft_s", "e2e_s", "cached_tokens", "preemptions"):
        np.testing.assert_allclose(fast[key], slow[key], rtol=1e-9, err_msg=key)


@unless_compiled("kvsim.engine.scheduler")
@pytest.mark.parametrize("small_batch", [4, 10_000], ids=["mixed", "lists"])
def test_decode_batches_count_their_blocks_alike_in_lists_and_arrays(monkeypatch, small_batch):
    """A decode batch's block count runs in lists up to `SMALL_BATCH` requests and in numpy
    above: lists for some batches or for all give the run numpy gives for all, bit for bit, with
    blocks so short that the step count of a run is searched for what fits."""
    rng = np.random.default_rng(5)
    reqs = [
        Req([(i + 1, int(rng.integers(50, 900)))], int(rng.integers(1, 300)), arrival_s=0.05 * i)
        for i in range(40)
    ]
    monkeypatch.setattr(scheduler_module, "SMALL_BATCH", 0)
    arrays, rows = run(reqs, num_gpu_blocks=300)
    monkeypatch.setattr(scheduler_module, "SMALL_BATCH", small_batch)
    lists, _ = run(reqs, num_gpu_blocks=300)
    assert sum(rows["preemptions"]) > 0  # blocks ran short
    assert same_table(lists.requests, arrays.requests)


def test_same_seed_same_results():
    reqs = [Req([(i % 3 + 1, 200 + 37 * i)], 20 + i, arrival_s=0.1 * i) for i in range(30)]
    reqs.append(Req([(1, 300)], 1, arrival_s=0.2))  # a one-token reply: its TPOT is NaN
    a, _ = run(reqs, num_gpu_blocks=300)
    b, _ = run(reqs, num_gpu_blocks=300)
    assert np.isnan(a.requests["tpot_s"].to_numpy()).any()
    assert same_table(a.requests, b.requests)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 25))
    reqs = []
    for i in range(n):
        segs = draw(
            st.lists(st.tuples(st.integers(1, 6), st.integers(1, 400)), min_size=1, max_size=3)
        )
        reqs.append(
            Req(
                segs,
                draw(st.integers(1, 120)),
                arrival_s=draw(st.floats(0, 5)),
                output_hash=draw(st.sampled_from([0, 100 + i])),
            )
        )
    engine = dict(
        num_gpu_blocks=draw(st.integers(30, 400)),
        block_size=draw(st.sampled_from([4, 16, 32])),
        max_num_seqs=draw(st.integers(1, 16)),
        max_num_batched_tokens=draw(st.integers(64, 2048)),
        policy=draw(st.sampled_from(builtin_policy_names())),
    )
    return reqs, engine


@unless_compiled("kvsim.engine.scheduler")
@settings(
    max_examples=int(os.environ.get("KVSIM_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(workloads())
def test_invariants_under_random_workloads(case):
    reqs, engine = case
    checks = []
    complete = scheduler_module.Scheduler._complete
    advance = scheduler_module.Scheduler._advance_decode

    def check(replica):
        replica.kv.pool.check()
        uncached = sum(r.held_blocks - len(r.held_cached) for r in replica.running)
        pinned = {r.hashes[p] for r in replica.running for p in r.held_cached}
        # every block is accounted for exactly once, and HBM is never over capacity
        assert uncached + len(pinned) == replica.kv.pool.used <= replica.kv.pool.num_blocks
        # a request's blocks hold its computed tokens (the scheduler's decode fast path reads
        # its table only when the last block is full)
        assert all(
            r.table.compacted or r.held_blocks * replica.block_size >= r.computed
            for r in replica.running
        )
        checks.append(uncached)

    def checked_complete(self, decoders, batch):
        complete(self, decoders, batch)
        check(self)

    def checked_advance(self, batch, steps, first_step_end_s):
        advance(self, batch, steps, first_step_end_s)
        check(self)

    scheduler_module.Scheduler._complete = checked_complete
    scheduler_module.Scheduler._advance_decode = checked_advance
    try:
        _result, rows = run(reqs, **engine)
    finally:
        scheduler_module.Scheduler._complete = complete
        scheduler_module.Scheduler._advance_decode = advance
    assert checks or all(s == "rejected" for s in rows["status"])
    capacity = engine["num_gpu_blocks"] * engine["block_size"]
    for row, i in enumerate(rows["request_id"]):
        r = reqs[i]
        total = sum(t for _, t in r.segments) + r.output_tokens
        expected = "rejected" if total > capacity else "completed"
        assert rows["status"][row] == expected
        assert rows["cached_tokens"][row] <= rows["input_tokens"][row]
        if expected == "completed":
            assert 0 < rows["ttft_s"][row] <= rows["e2e_s"][row]


def test_engine_config_rejects_nonsense():
    from kvsim.engine.resolve import check_fields
    from kvsim.errors import ConfigError

    with pytest.raises(ConfigError, match="block_size"):
        check_fields(EngineConfig(block_size=0))
    with pytest.raises(ConfigError, match="num_gpu_blocks"):
        check_fields(dataclasses.replace(EngineConfig(), num_gpu_blocks=0))
    with pytest.raises(ConfigError, match="block_size"):  # and every run checks them
        simulate(make_trace([Req([(1, 16)], 4)]), MODEL, PROFILE, EngineConfig(block_size=0))


@pytest.mark.parametrize("policy", builtin_policy_names())
def test_every_policy_runs_in_the_engine(policy):
    # a shared system prompt, multi-turn sessions and a pool small enough to evict
    reqs = []
    for s in range(12):
        history = [(999, 256), (s + 1, 100)]
        for turn in range(3):
            reqs.append(
                Req(
                    list(history),
                    40,
                    arrival_s=0.3 * s,
                    session_id=s,
                    turn=turn,
                    think_time_s=None if turn == 0 else 1.0,
                    output_hash=1000 * s + turn + 7,
                    kinds=["system", "user"] + ["assistant", "user"] * turn,
                )
            )
            history += [(1000 * s + turn + 7, 40), (5000 + 10 * s + turn, 30)]
    result, rows = run(reqs, num_gpu_blocks=120, policy=policy)
    assert rows["status"] == ["completed"] * len(reqs)
    assert result.evictions > 0
    assert sum(rows["cached_tokens"]) > 0

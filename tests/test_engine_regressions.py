"""Regressions from the hardening probe (issue 10): runs that crashed or never ended."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.engine import EngineConfig
from kvsim.run import RunConfig, run


@pytest.mark.parametrize(
    ("trace", "max_requests", "blocks"),
    [("mooncake-toolagent", 2000, None), ("agentic", 1500, 3000)],
)
def test_prefetch_during_a_coalesced_decode_run_leaves_its_blocks(trace, max_requests, blocks):
    """A prefetch that landed during a coalesced decode run took blocks the run had counted on
    ('coalesced decode ran out of blocks it had counted'). Prefetch now leaves them alone."""
    engine = EngineConfig(num_gpu_blocks=blocks)
    outcome = run(RunConfig(trace=trace, max_requests=max_requests, engine=engine))
    # one mooncake-toolagent request (131,216 tokens) is beyond llama-3.1-8b's 131,072-token
    # context and is refused at once; every other request completes
    beyond = {"mooncake-toolagent": 1}.get(trace, 0)
    assert outcome.summary["completed"] == max_requests - beyond
    assert outcome.summary["rejected"] == beyond
    assert outcome.summary["prefetched_blocks"] > 0


def test_link_transfers_end_late_in_a_long_run():
    """`--rate 0.04 --num-gpu-blocks 400` on lmsys: the clock passes 16,384 s with transfers in
    flight, where the old completion threshold never fired; the run never ended."""
    engine = EngineConfig(num_gpu_blocks=400)
    outcome = run(RunConfig(trace="lmsys", max_requests=2000, rate=0.04, engine=engine))
    # a few prompts are larger than 400 blocks and are refused at once
    assert outcome.summary["completed"] + outcome.summary["rejected"] == 2000
    assert outcome.summary["simulated_s"] > 16_384


def test_idle_stretches_cost_no_timeline_samples():
    """A day-long gap between two requests used to be sampled every simulated second (a trace
    in epoch milliseconds grew past 1 GB); now an idle cluster sleeps until the next arrival."""
    from helpers import Req, make_trace

    from kvsim.engine import simulate
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    day = 86_400.0
    reqs = [Req([(1, 500)], 20, arrival_s=0.0), Req([(1, 500), (2, 50)], 20, arrival_s=day)]
    for engine in (EngineConfig(), EngineConfig(replicas=3, tiers="hbm,dram")):
        result = simulate(
            make_trace(reqs), load_model("llama-3.1-8b"), load_profile("h100-sxm"), engine
        )
        timeline = result.timeline.to_pydict()
        assert len(timeline["time_s"]) < 20
        assert day in timeline["time_s"]  # woken by the arrival, sampled at once
        assert result.requests.column("status").to_pylist() == ["completed", "completed"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.floats(0, 1e9), min_size=1, max_size=6),  # arrival times, any gap, any clock
    st.sampled_from(["hbm", "hbm,dram"]),
    st.integers(1, 3),
)
def test_no_gap_or_clock_makes_the_timeline_grow_without_bound(arrivals, tiers, replicas):
    """Samples are taken only while something is in the system: their count is bounded by the
    busy time over the interval plus one per arrival, whatever the gaps and the clock."""
    from helpers import Req, make_trace

    from kvsim.engine import simulate
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    reqs = [Req([(i % 2, 300)], 30, arrival_s=t) for i, t in enumerate(sorted(arrivals))]
    engine = EngineConfig(tiers=tiers, replicas=replicas, num_gpu_blocks=200)
    result = simulate(
        make_trace(reqs), load_model("llama-3.1-8b"), load_profile("h100-sxm"), engine
    )
    rows = result.timeline.num_rows
    busy = sum(float(e) for e in result.requests.column("e2e_s").to_pylist())
    assert rows <= busy / engine.timeline_interval_s + 3 * len(reqs) + 2
    assert result.requests.column("status").to_pylist() == ["completed"] * len(reqs)


@pytest.mark.parametrize(
    ("engine", "needle"),
    [
        (dict(tier_capacity="nvme=1TB"), "tier capacity nvme: tier nvme is not enabled"),
        (dict(policy="hbm=lru,nvme=arc"), "policy nvme: tier nvme is not enabled"),
        (dict(admission="cxl=second-chance"), "admission cxl: tier cxl is not enabled"),
    ],
)
def test_settings_for_a_tier_not_enabled_say_so(engine, needle):
    """`--tier nvme=1TB` or `--policy nvme=arc` without nvme in the run's tiers did nothing,
    silently; now the run warns (on stderr, and in the summary's run_warnings)."""
    outcome = run(RunConfig(max_requests=3, engine=EngineConfig(**engine)))
    assert any(needle in w for w in outcome.summary["run_warnings"])
    assert outcome.summary["completed"] == 3


def test_belady_on_a_trace_whose_prompts_fill_no_block():
    """Belady's oracle had no accesses to index (a 1-token prompt fills no 4-token block) and
    failed building an empty table (found by test_invariants_under_random_workloads)."""
    from helpers import Req, make_trace

    from kvsim.engine import simulate
    from kvsim.hardware import load_profile
    from kvsim.models import load_model
    from kvsim.policies.oracle import FutureUses

    empty = FutureUses(np.zeros(0, np.int64), np.zeros(0))
    assert empty(7, 0.0) == float("inf") and empty.following().size == 0
    config = EngineConfig(
        num_gpu_blocks=30, block_size=4, max_num_seqs=1, max_num_batched_tokens=64, policy="belady"
    )
    trace = make_trace([Req([(1, 1)], 1, arrival_s=0.0)])
    result = simulate(trace, load_model("llama-3.1-8b"), load_profile("h100-sxm"), config)
    assert result.requests.column("status").to_pylist() == ["completed"]

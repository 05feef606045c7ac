"""Regressions from the hardening probe (issue 10): runs that crashed or never ended."""

from __future__ import annotations

import pytest

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
    assert outcome.summary["completed"] == max_requests
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

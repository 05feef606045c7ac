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

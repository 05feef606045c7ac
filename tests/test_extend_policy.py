"""A policy of one's own: the worked example in examples/extend/ runs and says what it says, and
the registry it relies on lists the new name, refuses it twice and checks its parameters."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import run_python

from kvsim.policies import EvictionPolicy, register

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "extend" / "policy.py"


def test_the_worked_example_runs_and_prints_what_it_shows():
    done = run_python(str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        "registered: True",
        "made: DepthLRUParams(seconds_per_block=2.0)",
        "agentic, 100 requests, 1,024 HBM blocks, DRAM 16GB per node",
        "policy                         hit ratio  from HBM  from DRAM  TTFT p50 s",
    ]
    rows = [line.split() for line in lines[4:]]
    assert [r[0] for r in rows] == ["lru", "depth-lru", "depth-lru.seconds_per_block=0"]
    lru, depth, depth_zero = ([float(x) for x in r[1:]] for r in rows)
    for hit, hbm, dram, ttft_p50 in (lru, depth):
        assert 0 < hit <= 1 and abs(hbm + dram - hit) <= 0.002 and ttft_p50 > 0
    assert depth != lru  # the new order is the one that ran
    assert depth_zero == lru  # at 0 s per block it is LRU, hit for hit


def test_the_registry_lists_refuses_twice_and_checks_parameters():
    code = textwrap.dedent(f"""
        import runpy
        import pytest
        from kvsim.errors import ConfigError, UnknownNameError
        from kvsim.policies import make_policy, policy_names, register

        DepthLRU = runpy.run_path({str(EXAMPLE)!r})["DepthLRU"]  # registers it, runs no main
        assert "depth-lru" in policy_names()
        assert type(make_policy("depth-lru")) is DepthLRU
        with pytest.raises(ValueError, match="policy 'depth-lru' registered twice"):
            register(DepthLRU)
        with pytest.raises(UnknownNameError, match="; valid: .*, depth-lru, "):
            make_policy("depth-lfu")
        with pytest.raises(ConfigError, match="unknown parameter 'seconds'; valid: "
                           "seconds_per_block"):
            make_policy("depth-lru", {{"seconds": 1}})
        with pytest.raises(ConfigError, match="parameter seconds_per_block: expected a number"):
            make_policy("depth-lru", {{"seconds_per_block": "1s"}})
        with pytest.raises(ConfigError, match="policy 'depth-lru': seconds_per_block must be "
                           ">= 0, got -1.0"):
            make_policy("depth-lru", {{"seconds_per_block": -1}})
    """)
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr


def test_a_builtin_name_cannot_be_taken():
    class Again(EvictionPolicy):
        name = "lru"

    with pytest.raises(ValueError, match="policy 'lru' registered twice"):
        register(Again)

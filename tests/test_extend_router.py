"""A router of one's own: the worked example in examples/extend/ runs and says what it says, and
the registry it relies on lists the new name, refuses it twice and checks its parameters."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import run_python

from kvsim.routers import Router, register

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "extend" / "router.py"


def test_the_worked_example_runs_and_prints_what_it_shows():
    done = run_python(str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        "registered: True",
        "made: LongestPrefixParams(slack_blocks=256)",
        "agentic, 200 requests, 4 replicas",
        "router                           hit ratio  TTFT p50 s  requests per replica",
    ]
    rows = [line.split() for line in lines[4:]]
    assert [r[0] for r in rows] == ["round-robin", "longest-prefix",
                                    "longest-prefix.slack_blocks=256"]  # fmt: skip
    (rr_hit, rr_ttft), (strict_hit, _), (slack_hit, _) = ([float(x) for x in r[1:3]] for r in rows)
    served = [[int(x) for x in r[3:]] for r in rows]
    assert all(0 < hit <= 1 for hit in (rr_hit, strict_hit, slack_hit)) and rr_ttft > 0
    assert [sum(s) for s in served] == [200, 200, 200]
    assert served[0] == [50, 50, 50, 50]  # round-robin takes turns
    assert served[1] == [200, 0, 0, 0]  # strictly, the system prompt's replica takes all
    assert min(served[2]) > 0  # with slack, every replica serves
    assert strict_hit > slack_hit > rr_hit  # slack trades hits for balance


def test_the_registry_lists_refuses_twice_checks_parameters_and_the_rule_holds():
    code = textwrap.dedent(f"""
        import runpy
        import pytest
        from kvsim.errors import ConfigError, UnknownNameError
        from kvsim.routers import PrefixMatch, ReplicaLoad, RouteRequest
        from kvsim.routers import make_router, register, router_names

        LongestPrefix = runpy.run_path({str(EXAMPLE)!r})["LongestPrefix"]  # no main
        assert "longest-prefix" in router_names()
        assert type(make_router("longest-prefix")) is LongestPrefix
        with pytest.raises(ValueError, match="router 'longest-prefix' registered twice"):
            register(LongestPrefix)
        with pytest.raises(UnknownNameError, match="; valid: .*, longest-prefix, "):
            make_router("longest-suffix")
        with pytest.raises(ConfigError, match="unknown parameter 'slack'; valid: slack_blocks"):
            make_router("longest-prefix", {{"slack": 1}})
        with pytest.raises(ConfigError, match="parameter slack_blocks: expected an integer"):
            make_router("longest-prefix", {{"slack_blocks": 1.5}})
        with pytest.raises(ConfigError, match="router 'longest-prefix': parameter "
                           "'slack_blocks' must be >= 0"):
            make_router("longest-prefix", {{"slack_blocks": -1}})

        class View:  # three replicas holding 5, 5 and 3 blocks, with 900, 800, 100 tokens out
            now_s = 0.0
            loads = [ReplicaLoad(index=w, node=0, role="mixed", waiting=0, running=1,
                                 prefill_tokens=prefill, decode_blocks=1,  # + 16 tokens
                                 kv_usage=0.01, capacity_blocks=100)
                     for w, prefill in enumerate((884, 784, 84))]
            def match(self, replica, request):
                return PrefixMatch(device=(5, 5, 3)[replica])

        request = RouteRequest(index=0, session_id=0, input_tokens=100, block_size=16,
                           hashes=list(range(7)))
        assert make_router("longest-prefix").choose(request, View(), [0, 1, 2]) == 1
        assert make_router("longest-prefix").choose(request, View(), [0, 2]) == 0
        slack = make_router("longest-prefix", {{"slack_blocks": 2}})
        assert slack.choose(request, View(), [0, 1, 2]) == 2
    """)
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr


def test_a_builtin_name_cannot_be_taken():
    class Again(Router):
        name = "round-robin"

    with pytest.raises(ValueError, match="router 'round-robin' registered twice"):
        register(Again)

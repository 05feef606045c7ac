"""The tool-call hint is not an oracle (issue 45): on every agent source, "tool call" does not
mean "the session comes back" with certainty, and on the drawn ones it still says more than the
base rate. Drawn hints are seeded: the same seed gives the same bits."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.traces import load_trace, traces_dir
from kvsim.traces.toolhint import CUT_SESSION_SHARE, INTERRUPTED_SESSION_SHARE, draw_tool_hints


def _hint_and_truth(trace) -> tuple[np.ndarray, np.ndarray]:
    """(reply hinted as a tool call, its session has a later call) per row."""
    table = trace.table
    session = table.column("session_id").to_numpy()
    turn = table.column("turn").to_numpy()
    hinted = ~np.isnan(table.column("tool_wait_s").to_numpy(zero_copy_only=False))
    later = set(zip(session.tolist(), turn.tolist(), strict=True))
    continues = np.array([(s, t + 1) in later for s, t in zip(session, turn, strict=True)])
    return hinted, continues


def _rates(trace) -> tuple[float, float, float]:
    """P(continue | hint), P(continue) (the base rate), P(hint | continue)."""
    hinted, continues = _hint_and_truth(trace)
    return continues[hinted].mean(), continues.mean(), hinted[continues].mean()


@pytest.mark.parametrize(
    ("name", "requests"), [("agentic", None), ("mooncake-toolagent", 6000)]
)  # fmt: skip
def test_drawn_hint_is_informative_but_not_certain(name: str, requests: int | None) -> None:
    given_hint, base, recall = _rates(load_trace(name, max_requests=requests))
    assert given_hint < 0.99  # some tool calls are abandoned: their session never returns
    assert recall < 1.0  # some continuing replies carry no hint (a user interrupt)
    # ... and the hint still carries signal: well above the base rate of a next call.
    assert given_hint > base + 0.05 and recall > 0.95


@pytest.mark.parametrize("name", ["agentic", "mooncake-toolagent"])
def test_drawn_hint_is_seeded(name: str) -> None:
    def bits(seed: int) -> np.ndarray:
        return _hint_and_truth(load_trace(name, max_requests=2000, seed=seed))[0]

    assert (bits(3) == bits(3)).all()
    assert (bits(3) != bits(4)).any()


def test_toolagent_longer_trace_extends_the_hints_of_a_shorter_one() -> None:
    short = load_trace("mooncake-toolagent", max_requests=800).table
    long = load_trace("mooncake-toolagent", max_requests=3000).table
    key = ["session_id", "turn"]
    short_keys = set(zip(*(short.column(k).to_pylist() for k in key), strict=True))
    long_hint = dict(zip(zip(*(long.column(k).to_pylist() for k in key), strict=True),
                         long.column("tool_wait_s").to_pylist(), strict=True))  # fmt: skip
    short_hint = dict(zip(zip(*(short.column(k).to_pylist() for k in key), strict=True),
                          short.column("tool_wait_s").to_pylist(), strict=True))  # fmt: skip
    assert all(short_hint[k] == long_hint[k] for k in short_keys)


def test_draw_matches_the_published_rates() -> None:
    """Over many sessions the drawn misses come out at the published rates."""
    rng = np.random.default_rng(7)
    sessions, calls = 40_000, 6
    session = np.repeat(np.arange(sessions), calls)
    continues = np.tile(np.arange(calls) < calls - 1, sessions)
    hinted = draw_tool_hints(continues, session, rng)
    cut = hinted[~continues].mean()
    interrupted = (~hinted & continues).reshape(sessions, calls).any(axis=1).mean()
    assert cut == pytest.approx(CUT_SESSION_SHARE, abs=0.01)
    assert interrupted == pytest.approx(INTERRUPTED_SESSION_SHARE, abs=0.005)


def test_swe_agent_hint_is_the_recorded_action() -> None:
    """Real trajectories: every reply records an action, the final `submit` included, so a tool
    call is not a promise of a next call (here it says nothing beyond the base rate)."""
    given_hint, base, recall = _rates(load_trace(traces_dir() / "swe-agent"))
    assert given_hint < 1.0 and recall == 1.0
    assert given_hint == pytest.approx(base)


def _dynamo_event(ts: int, kind: str, session: str, **extra: object) -> dict:
    event = {"schema": "dynamo.request.trace.v1", "event_type": kind,
             "agent_context": {"session_id": session}, **extra}  # fmt: skip
    return {"timestamp": ts, "event": event}


def _request_end(ts: int, session: str, tokens: int) -> dict:
    replay = {"trace_block_size": 16, "input_sequence_hashes": list(range(1, -(-tokens // 16) + 1))}
    request = {"input_tokens": tokens, "output_tokens": 4, "total_time_ms": 100,
               "replay": replay}  # fmt: skip
    return _dynamo_event(ts, "request_end", session, request=request)


def test_dynamo_hint_is_the_recorded_tool_event(tmp_path: Path) -> None:
    """A Dynamo trace's hint is a logged tool event after the call, so a call whose tool never
    returned to the model (no later call) is still a tool call."""
    rows = [
        _request_end(1_000, "s", 32),
        _dynamo_event(1_010, "tool_start", "s"),
        _request_end(2_000, "s", 48),
        _dynamo_event(2_010, "tool_start", "s"),  # abandoned: the session ends here
    ]
    path = tmp_path / "abandoned.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.writelines(json.dumps(r) + "\n" for r in rows)
    hinted, continues = _hint_and_truth(load_trace(path))
    assert hinted.tolist() == [True, True] and continues.tolist() == [True, False]

"""Request hints reach the policies, through the engine and the cache-only replay, and say that a
reply is a tool call only once the reply exists (when the request releases its blocks)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from helpers import Req, make_trace

from kvsim.engine import EngineConfig, simulate
from kvsim.hardware import load_profile
from kvsim.kvcache.hints import TraceHints
from kvsim.models import load_model
from kvsim.mrc import BlockSequence, replay
from kvsim.policies import BlockInfo, EvictionPolicy, RequestHint
from kvsim.policies.lru import LRU
from kvsim.traces import Trace

SEEN: list[tuple[str, int, RequestHint | None]] = []


class Recorder(LRU):
    """LRU that records the hint of every call (module:Class plugin for the engine)."""

    reads_info = True
    add_many = EvictionPolicy.add_many  # through `add` and `access`, which record
    pin_many = EvictionPolicy.pin_many

    def add(self, key: int, info: BlockInfo) -> None:
        SEEN.append(("add", key, info.hint))
        super().add(key, info)

    def access(self, key: int, info: BlockInfo) -> None:
        SEEN.append(("access", key, info.hint))
        super().access(key, info)

    def miss(self, key: int, info: BlockInfo) -> None:
        SEEN.append(("miss", key, info.hint))


def _trace() -> Trace:
    """Session 7: an agent call whose reply is a tool call (about 3 s), then the call after
    the tool returns, extending the first prompt; session 8: one API call."""
    first = [(1, 64)]
    reqs = [
        Req(first, 4, arrival_s=0.0, session_id=7, turn=0),
        Req([*first, (2, 48)], 4, arrival_s=0.0, session_id=7, turn=1, think_time_s=1.0),
        Req([(3, 40)], 4, arrival_s=0.5, session_id=8, turn=0),
    ]
    t = make_trace(reqs).table
    columns = {
        "parent_id": pa.array([-1, 0, -1], pa.int64()),
        "category": pa.array(["agent", "agent", "api"], pa.string()),
        "tool_wait_s": pa.array([3.0, None, None], pa.float64()),
    }
    for name, column in columns.items():
        i = t.schema.get_field_index(name)
        t = t.set_column(i, t.schema.field(i), column)
    return Trace.from_table(t)


def test_trace_hints_read_the_columns_and_hide_the_reply_until_it_exists() -> None:
    hints = TraceHints(_trace().table)
    rows = sorted(range(3), key=lambda i: int(hints.turn[i]) + 10 * int(hints.session[i]))
    first, second, api = (hints.at(i) for i in rows)
    assert first == RequestHint(7, 0, -1, "agent", 3.0)
    assert second == RequestHint(7, 1, 0, "agent", -1.0)
    assert api == RequestHint(8, 0, -1, "api", -1.0)
    assert hints.at(rows[0], replied=False).tool_wait_s == -1.0


def test_old_tables_without_hint_columns_give_defaults() -> None:
    t = _trace().table.drop_columns(["parent_id", "category", "tool_wait_s"])
    hints = TraceHints(t)
    assert {hints.at(i).category for i in range(3)} == {""}
    assert {(hints.at(i).parent, hints.at(i).tool_wait_s) for i in range(3)} == {(-1, -1.0)}


def _check(seen: list[tuple[str, int, RequestHint | None]]) -> None:
    assert seen, "the policy was never called"
    assert all(h is not None for _, _, h in seen)
    # the tool call is known only at release, and only the first call's reply is one
    tool = {(e, h.session, h.turn) for e, _, h in seen if h is not None and h.tool_wait_s >= 0}
    assert tool == {("add", 7, 0)}
    adds = [h for e, _, h in seen if e == "add" and h is not None and h.session == 7]
    assert {(h.turn, h.parent, h.category) for h in adds} == {(0, -1, "agent"), (1, 0, "agent")}
    hits = [h for e, _, h in seen if e == "access" and h is not None]
    assert hits and {(h.session, h.turn, h.tool_wait_s) for h in hits} == {(7, 1, -1.0)}


@pytest.fixture(autouse=True)
def _clear() -> None:
    SEEN.clear()


def test_the_engine_hands_each_request_hint_to_the_policy() -> None:
    config = EngineConfig(policy="test_request_hints:Recorder", block_size=16)
    simulate(_trace(), load_model("llama-3.1-8b"), load_profile("h100-sxm"), config)
    _check(SEEN)


def test_the_cache_only_replay_hands_the_same_hints() -> None:
    seq = BlockSequence.from_trace(_trace(), 16)
    replay(seq, Recorder(), 64, "prefix")
    _check(SEEN)

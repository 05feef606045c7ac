"""Request-hint columns (`parent_id`, `category`, `tool_wait_s`; issue 23): every source with
session structure fills them as `kvsim.traces.schema` describes, conversion keeps them, and files
written before they existed still load with the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvsim.errors import TraceError
from kvsim.traces import load_trace, read_trace, traces_dir, validate_trace, write_trace
from kvsim.traces.agentic import AgenticParams
from kvsim.traces.chat import read_lmsys, read_sharegpt_json
from kvsim.traces.common import RequestIds
from kvsim.traces.convert import convert_to_parquet
from kvsim.traces.lmsys import LmsysParams, write_lmsys_parquet
from kvsim.traces.replay import collect
from kvsim.traces.schema import HINT_COLUMNS, TRACE_SCHEMA, drop_bad_rows


def col(trace, name: str) -> np.ndarray:
    return np.asarray(trace.table.column(name).to_pylist(), dtype=object)


def previous_turns(trace) -> np.ndarray:
    """The request id of each row's previous turn in its session (-1 for a first turn)."""
    ids = {key: r for r, key in zip(col(trace, "request_id"), keys_of(trace), strict=True)}
    return np.array([ids.get((s, t - 1), -1) for s, t in keys_of(trace)])


def has_next_turn(trace) -> np.ndarray:
    keys = set(zip(col(trace, "session_id"), col(trace, "turn"), strict=True))
    return np.array([(s, t + 1) in keys for s, t in keys_of(trace)])


def keys_of(trace) -> list[tuple[int, int]]:
    return list(zip(col(trace, "session_id"), col(trace, "turn"), strict=True))


@pytest.mark.parametrize("name", ["sharegpt", "lmsys"])
def test_chat_generators_follow_the_previous_turn(name):
    tr = load_trace(name, max_requests=600)
    assert set(col(tr, "category")) == {"chat"}
    assert (col(tr, "parent_id") == previous_turns(tr)).all()
    assert (col(tr, "turn") > 0).sum() > 50  # enough later turns for the rule to mean something
    assert set(col(tr, "tool_wait_s")) == {None}  # chat replies are not tool calls


def test_agentic_parents_and_the_mean_tool_wait_never_the_drawn_one():
    params = AgenticParams()
    tr = load_trace("agentic")
    session, turn = col(tr, "session_id"), col(tr, "turn")
    parent, wait = col(tr, "parent_id"), col(tr, "tool_wait_s")
    assert set(col(tr, "category")) == {"agent"}
    # Roots (sessions below params.sessions) and later calls: the call before.
    spawned = (session >= params.sessions) & (turn == 0)
    assert spawned.sum() > 10
    assert (parent[~spawned] == previous_turns(tr)[~spawned]).all()
    # A subagent's first call follows its root's first call, and starts when that reply ends
    # (the generator's nominal 0.02 s per output token).
    row_of = {r: i for i, r in enumerate(col(tr, "request_id"))}
    arrival, out = col(tr, "arrival_s"), col(tr, "output_tokens")
    for i in np.flatnonzero(spawned):
        p = row_of[parent[i]]
        assert session[p] < params.sessions and turn[p] == 0
        assert arrival[i] == pytest.approx(arrival[p] + 0.02 * out[p])
    # A tool call's hint is the mean wait, 0.5 s; which replies are tool calls is drawn apart
    # from the continuation (issue 45: tests/test_tool_hint_oracle.py), so both kinds of miss
    # occur: a session's last reply marked, and a continuing reply unmarked.
    later = has_next_turn(tr)
    assert set(wait) == {params.tool_wait_mean_s, None}
    hinted = wait != None  # noqa: E711 (an object array of floats and None)
    assert (hinted & ~later).any() and (~hinted & later).any()
    # ... while the drawn waits (think time of the next call) spread widely around it.
    think = np.array([t for t in col(tr, "think_time_s")[turn > 0] if t is not None], float)
    assert think.std() > 0.5 and np.isclose(think, params.tool_wait_mean_s).mean() < 0.01


def test_toolagent_tool_calls_are_known_but_not_timed():
    tr = load_trace("mooncake-toolagent", max_requests=1500)
    assert set(col(tr, "category")) == {"agent"}
    assert (col(tr, "parent_id") == previous_turns(tr)).all()
    wait = col(tr, "tool_wait_s")
    later = has_next_turn(tr)
    assert (wait[later] == 0.0).mean() > 0.95  # most replies a tool output follows are marked
    assert set(wait) == {0.0, None}


def test_pi_coding_agent_worked_hints():
    tr = load_trace("pi-coding-agent")
    # Sessions: 0 a one-call probe, 1 the root, 2-4 its subagents (scout:0, scout:1, reviewer:2).
    assert col(tr, "session_id").tolist() == [0, 1, 1, 2, 3, 4, 2, 3, 2, 4, 2, 3, 2, 2, 1, 1, 1]
    # The subagents' first calls (rows 3-5) follow the root's second call (request 2): its tool
    # (tool_start 2 ms after it ended) ran the subagents; the root's first tool call failed.
    assert col(tr, "parent_id").tolist() == [-1, -1, 1, 2, 2, 2, 3, 4, 6, 5, 8, 7, 10, 12, 2, 14,
                                             15]  # fmt: skip
    # A tool event after a call and before its session's next one: a tool call of unknown length.
    # Rows 9, 11, 13 and 16 are sessions' final answers; row 0 logged no tool.
    assert col(tr, "tool_wait_s").tolist() == [None, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None,
                                               0.0, None, 0.0, None, 0.0, 0.0, None]  # fmt: skip
    assert set(col(tr, "category")) == {"agent"}


def test_swe_agent_sample_recorded_actions_make_tool_calls():
    tr = load_trace(traces_dir() / "swe-agent" / "gpt4_pydicom__pydicom-1458.traj")
    assert (col(tr, "parent_id") == previous_turns(tr)).all()
    assert col(tr, "parent_id").tolist() == [-1, *range(11)]
    # Every reply records an action, the last one `submit` (no observation follows it): twelve
    # tool calls, known when each reply was decoded, not from what came next (issue 45).
    assert col(tr, "tool_wait_s").tolist() == [0.0] * 12
    assert set(col(tr, "category")) == {"agent"}
    folder = load_trace(traces_dir() / "swe-agent")  # three files, three sessions
    assert (col(folder, "parent_id") == previous_turns(folder)).all()


def test_sharegpt_file_streamed_in_small_batches_keeps_parents(tmp_path):
    # Later turns of early conversations arrive after later conversations start, so the
    # streaming writer holds them across writes and must find their parents' ids afterwards.
    convs = [{"id": str(c), "conversations": [
        {"from": "human" if k % 2 == 0 else "gpt", "value": f"c{c} m{k} " + "x" * (4 * k + c)}
        for k in range(2 * (1 + c % 4))]} for c in range(30)]  # fmt: skip
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(convs))
    whole = collect(read_sharegpt_json(path, batch=4))
    assert set(col(whole, "category")) == {"chat"}
    assert (col(whole, "parent_id") == previous_turns(whole)).all()
    out = tmp_path / "chats.parquet"
    written, _ = convert_to_parquet(read_sharegpt_json(path, batch=4), out)
    assert written == len(whole) == sum(1 + c % 4 for c in range(30))
    assert read_trace(out).table.equals(whole.table)


def test_lmsys_parquet_streamed_keeps_parents(tmp_path):
    path = tmp_path / "lmsys.parquet"
    write_lmsys_parquet(path, 200, seed=3, params=LmsysParams(mean_turns=3.0))
    whole = collect(read_lmsys(path, batch=32))
    assert (col(whole, "parent_id") == previous_turns(whole)).all()
    assert (col(whole, "turn") > 0).sum() > 100
    out = tmp_path / "c.parquet"
    convert_to_parquet(read_lmsys(path, batch=32), out)
    assert read_trace(out).table.equals(whole.table)


def test_jsonl_hint_fields(tmp_path):
    rows = [
        {"arrival_s": 0, "session": "a", "output_tokens": 5, "segments": [["s", 10]],
         "category": "agent", "tool_wait_s": 1.5},
        {"arrival_s": 1, "output_tokens": 5, "segments": [["t", 10]]},
        {"arrival_s": 2, "session": "a", "output_tokens": 5, "segments": [["s", 10], ["u", 3]],
         "category": "agent", "tool_wait_s": None},
    ]  # fmt: skip
    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tr = load_trace(path)
    assert col(tr, "parent_id").tolist() == [-1, -1, 0]
    assert col(tr, "category").tolist() == ["agent", "", "agent"]
    assert col(tr, "tool_wait_s").tolist() == [1.5, None, None]
    for field, value in (("tool_wait_s", -1), ("category", 7), ("category", "x" * 65)):
        path.write_text(json.dumps({**rows[1], field: value}) + "\n")
        with pytest.raises(TraceError, match=rf"h\.jsonl:1: field '{field}': expected"):
            load_trace(path)


def test_burstgpt_log_type_is_the_category(tmp_path):
    path = tmp_path / "BurstGPT_3.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID\n"
        "5,ChatGPT,472,18,490,Conversation log,s1\n"
        "60,ChatGPT,600,20,620,Conversation log,s1\n"
        "118,GPT-4,417,276,693,API log,\n"
    )
    tr = load_trace(path)
    assert col(tr, "category").tolist() == ["chat", "chat", "api"]
    assert col(tr, "parent_id").tolist() == [-1, 0, -1]


def test_mooncake_has_no_metadata():
    tr = load_trace("mooncake-arxiv-1000", max_requests=50)
    assert set(col(tr, "category")) == {""} and set(col(tr, "parent_id")) == {-1}
    assert set(col(tr, "tool_wait_s")) == {None}


# --- files written before the hint columns ----------------------------------------------------


def old_file(tmp_path: Path, name: str = "old.parquet") -> tuple[Path, pa.Table]:
    """The lmsys trace as a file from before issue 23: the canonical columns less the hints."""
    table = load_trace("lmsys", max_requests=300).table
    path = tmp_path / name
    pq.write_table(table.drop_columns(list(HINT_COLUMNS)), path)
    return path, table


def test_old_parquet_loads_with_the_defaults(tmp_path):
    path, table = old_file(tmp_path)
    for tr in (read_trace(path), load_trace(path), read_trace(path, skip_bad_rows=True)):
        assert tr.table.schema.remove_metadata().equals(TRACE_SCHEMA)
        assert set(col(tr, "parent_id")) == {-1} and set(col(tr, "category")) == {""}
        assert set(col(tr, "tool_wait_s")) == {None}
        fields = [f.name for f in TRACE_SCHEMA if f.name not in HINT_COLUMNS]
        assert tr.table.select(fields).equals(table.select(fields))


def test_a_hint_column_of_the_wrong_type_is_one_line(tmp_path):
    table = load_trace("lmsys", max_requests=20).table
    index = table.schema.get_field_index("category")
    bad = table.set_column(index, "category", pa.array(np.zeros(20, np.int32)))
    path = tmp_path / "bad.parquet"
    pq.write_table(bad, path)
    with pytest.raises(TraceError, match=r"bad\.parquet: field 'category': expected type string, "
                                         r"got int32$"):  # fmt: skip
        read_trace(path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("parent_id", -2, "expected a request id or -1 (none), got -2"),
        ("parent_id", 3, "expected another request's id"),
        ("tool_wait_s", -0.5, "expected null or finite >= 0, got -0.5"),
        ("tool_wait_s", np.inf, "expected null or finite >= 0, got inf"),
    ],
)
def test_bad_hint_values_name_row_and_field(tmp_path, field, value, message):
    table = load_trace("lmsys", max_requests=20).table
    index = table.schema.get_field_index(field)
    values = table.column(field).to_pylist()
    values[3] = value
    bad = table.set_column(
        index, TRACE_SCHEMA.field(field), pa.array(values, TRACE_SCHEMA.field(field).type)
    )
    with pytest.raises(TraceError) as info:
        validate_trace(bad, "src")
    assert str(info.value).startswith(f"src: row 3: field {field!r}: {message}")
    # Skipping drops the row, and a request that followed it loses its parent (-1).
    path = tmp_path / "b.parquet"
    write_trace(bad, path)
    tr = read_trace(path, skip_bad_rows=True)
    assert tr.skipped_rows == 1 and len(tr) == 19
    gone = bad.column("request_id")[3].as_py()
    assert gone not in col(tr, "request_id") and gone not in col(tr, "parent_id")


def test_skipping_a_parent_orphans_its_children():
    table = load_trace("sharegpt", max_requests=200).table
    parent = table.column("parent_id").to_numpy()
    child = int(np.flatnonzero(parent >= 0)[0])
    row = int(np.flatnonzero(table.column("request_id").to_numpy() == parent[child])[0])
    inputs = table.column("input_tokens").to_numpy().copy()
    inputs[row] += 1  # no longer the sum of its segments: a row wrong on its own
    index = table.schema.get_field_index("input_tokens")
    bad = table.set_column(index, TRACE_SCHEMA.field(index), pa.array(inputs, pa.int32()))
    kept, dropped = drop_bad_rows(bad, "src")
    assert dropped == 1
    rid = table.column("request_id")[child].as_py()
    ids = kept.column("request_id").to_pylist()
    assert kept.column("parent_id")[ids.index(rid)].as_py() == -1
    validate_trace(kept, "src")


@pytest.mark.parametrize("base", [0, 2**40])  # packed keys, and the two-field fallback
def test_request_ids_find_and_keep(base):
    ids = RequestIds()
    ids.add(np.array([5, 5, 9]) + base, np.array([0, 1, 0]), np.array([10, 11, 12]))
    ids.add(np.array([9]) + base, np.array([1]), np.array([13]))
    assert ids.rank.tolist() == [3]  # (9, 1) sorts last
    found = ids.find(np.array([5, 9, 9, 7, 5]) + base, np.array([1, 1, 0, 0, -1]))
    assert found.tolist() == [11, 13, 12, -1, -1]
    ids.keep(np.array([9, 4]) + base, np.array([0, 0]))
    assert len(ids) == 1 and ids.find(np.array([9, 5]) + base, np.array([0, 0])).tolist() == [
        12,
        -1,
    ]

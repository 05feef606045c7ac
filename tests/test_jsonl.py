"""kvsim JSONL, the trace format users write by hand: the documented example loads to exactly the
canonical table it describes and replays exactly through `kvsim.run.run`; every field is checked
with file, line and field named."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from inputs import one_line

from kvsim.errors import TraceError
from kvsim.run import RunConfig, run
from kvsim.traces import block_hashes, load_trace, make_trace_table, segment_columns, write_trace
from kvsim.traces.jsonl import string_hash
from kvsim.traces.registry import detect_format
from kvsim.traces.schema import KIND_CODES

DOCS = Path(__file__).resolve().parents[1] / "docs" / "traces.md"


def docs_example() -> str:
    """The JSONL example in docs/traces.md, so the documentation is what the tests run."""
    (block,) = re.findall(r"```jsonl\n(.*?)```", DOCS.read_text(), re.S)
    return block


def write(tmp: Path, rows: list[dict | str], name: str = "t.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def expected_docs_table():
    """The docs example's canonical table, built independently from its numbers."""
    h = string_hash
    sys_, q0, r0, bq, q1 = (h("system-v1"), h("alice-q0"), h("alice-r0"), h("bob-q0"),
                            h("alice-q1"))  # fmt: skip
    segs = [
        [(sys_, 1200, "system"), (q0, 35, "user")],
        [(sys_, 1200, "system"), (bq, 20, "user")],
        [(sys_, 1200, "system"), (q0, 35, "user"), (r0, 80, "assistant"), (q1, 12, "user")],
    ]
    flat = [s for row in segs for s in row]
    return make_trace_table(
        request_id=np.arange(3),
        session_id=np.array([0, 1, 0]),  # string sessions numbered by first appearance
        turn=np.array([0, 0, 1]),
        arrival_s=np.array([0.0, 0.5, 2.0]),
        think_time_s=np.array([np.nan, np.nan, 1.0]),
        input_tokens=np.array([1235, 1220, 1327]),
        output_tokens=np.array([80, 60, 50]),
        seg_offsets=np.array([0, 2, 4, 8]),
        seg_hashes=np.array([s[0] for s in flat], np.uint64),
        seg_tokens=np.array([s[1] for s in flat]),
        seg_kinds=np.array([KIND_CODES[s[2]] for s in flat], np.uint8),
        output_hash=np.array([r0, 0, 0], np.uint64),
        name="t",
        native_block_size=None,
        description="",
        parent_id=np.array([-1, -1, 0]),  # Alice's second turn follows her first (request 0)
    )


def test_docs_example_loads_to_exactly_the_table_it_describes(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(docs_example())
    assert detect_format(path) == "jsonl"
    trace = load_trace(path)
    want = expected_docs_table()
    for name in want.schema.names:
        assert trace.table.column(name).equals(want.column(name)), name
    assert trace.skipped_rows == 0 and trace.warnings == ()
    # The shared system prompt and Alice's re-sent history are shared blocks at any block size.
    seg = segment_columns(trace.table)
    chains = [
        block_hashes(seg.hashes[a:b], seg.tokens[a:b], 16).tolist()
        for a, b in zip(seg.offsets[:-1], seg.offsets[1:], strict=True)
    ]
    assert chains[0][:75] == chains[1][:75] and chains[0][75] != chains[1][75]
    assert chains[2][: 1235 // 16] == chains[0]


def _results(config: RunConfig):
    outcome = run(config)
    summary = {k: v for k, v in outcome.summary.items() if k not in ("trace", "wall_s")}
    return summary, outcome.result.requests


def test_hand_written_file_replays_exactly(tmp_path):
    """A run on the JSONL file equals a run on the canonical table it stands for, twice over."""
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(docs_example())
    parquet = tmp_path / "t.parquet"
    write_trace(expected_docs_table(), parquet)
    summary, requests = _results(RunConfig(trace=str(jsonl)))
    assert summary["requests"] == 3 and summary["completed"] == 3
    assert requests.column("input_tokens").to_pylist() == [1235, 1220, 1327]
    assert _results(RunConfig(trace=str(jsonl))) == (summary, requests)
    canonical_summary, canonical_requests = _results(RunConfig(trace=str(parquet)))
    assert canonical_summary == summary
    assert canonical_requests.equals(requests)


def test_defaults_sessions_turns_and_gzip(tmp_path):
    rows = [
        {"arrival_s": 3.0, "session": 7, "output_tokens": 2, "segments": [[5, 4]]},
        {"arrival_s": 1.0, "session": 7, "output_tokens": 2, "segments": [[5, 4]]},
        {"arrival_s": 2.0, "output_tokens": 1, "segments": [{"hash": "x", "tokens": 3}]},
    ]
    path = write(tmp_path, rows)
    table = load_trace(path).table
    assert table.column("session_id").to_pylist() == [7, 8, 7]  # ints kept; a fresh one after
    assert table.column("turn").to_pylist() == [0, 0, 1]  # by arrival, not by line
    assert table.column("output_hash").to_pylist() == [0, 0, 0]
    assert {s["kind"] for r in table.column("segments").to_pylist() for s in r} == {"user"}
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert detect_format(packed) == "jsonl"
    assert load_trace(packed).table.equals(table)


GOOD = {"arrival_s": 0.0, "output_tokens": 5, "segments": [{"hash": 1, "tokens": 4}]}


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({k: v for k, v in GOOD.items() if k != "arrival_s"}, "field 'arrival_s': missing"),
        ({**GOOD, "arrival": 1.0}, "field 'arrival': unknown field"),
        ({**GOOD, "arrival_s": -1}, "field 'arrival_s'"),
        ('{"arrival_s": NaN, "output_tokens": 5, "segments": [[1, 4]]}', "field 'arrival_s'"),
        ('{"arrival_s": Infinity, "output_tokens": 5, "segments": [[1, 4]]}', "field 'arrival_s'"),
        ({**GOOD, "arrival_s": "0"}, "field 'arrival_s'"),
        ({**GOOD, "segments": []}, "field 'segments'"),
        ({**GOOD, "segments": "abc"}, "field 'segments'"),
        ({**GOOD, "segments": [{"hash": 1}]}, "field 'segments[0].tokens': missing"),
        ({**GOOD, "segments": [[1, 0]]}, "field 'segments[0].tokens'"),
        ({**GOOD, "segments": [[1, 4.5]]}, "field 'segments[0].tokens'"),
        ({**GOOD, "segments": [[1, 4], [-1, 4]]}, "field 'segments[1].hash'"),
        ({**GOOD, "segments": [[2**64, 4]]}, "field 'segments[0].hash'"),
        ({**GOOD, "segments": [["", 4]]}, "field 'segments[0].hash'"),
        ({**GOOD, "segments": [[1, 4, "prose"]]}, "field 'segments[0].kind'"),
        ({**GOOD, "segments": [[1, 4, ["user"]]]}, "field 'segments[0].kind'"),
        ({**GOOD, "segments": [{"hash": 1, "tokens": 4, "role": "user"}]}, "segments[0].role"),
        ({**GOOD, "output_tokens": 0}, "field 'output_tokens'"),
        ({**GOOD, "output_tokens": True}, "field 'output_tokens'"),
        ({**GOOD, "output_hash": -3}, "field 'output_hash'"),
        ({**GOOD, "session": -1}, "field 'session'"),
        ({**GOOD, "session": 1.5}, "field 'session'"),
        ({**GOOD, "turn": -1}, "field 'turn'"),
        ({**GOOD, "turn": 1}, "field 'turn': expected 0"),
        ({**GOOD, "think_time_s": -2}, "field 'think_time_s'"),
        ({**GOOD, "input_tokens": 5}, "field 'input_tokens'"),
        ('{"arrival_s": 0, ', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_every_field_is_checked_naming_line_and_field(tmp_path, bad, field):
    path = write(tmp_path, [GOOD, {**GOOD, "arrival_s": 1.0}, bad])
    with pytest.raises(TraceError) as info:
        load_trace(path, format="jsonl")
    one_line(info, "t.jsonl:3: ", field)
    trace = load_trace(path, format="jsonl", skip_bad_rows=True)
    assert (len(trace), trace.skipped_rows) == (2, 1)


def test_mixed_session_kinds_are_refused(tmp_path):
    path = write(tmp_path, [{**GOOD, "session": "a"}, {**GOOD, "session": 3}])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, "t.jsonl:2: field 'session'", "int and str")


def test_skipping_a_turn_moves_the_later_turns_up(tmp_path):
    rows = [
        {**GOOD, "session": "s", "turn": 0},
        {**GOOD, "arrival_s": 1.0, "session": "s", "turn": 1, "output_tokens": 0},
        {**GOOD, "arrival_s": 2.0, "session": "s", "turn": 2},
    ]
    path = write(tmp_path, rows)
    with pytest.raises(TraceError, match=r"t\.jsonl:2: field 'output_tokens'"):
        load_trace(path)
    trace = load_trace(path, skip_bad_rows=True)
    # Row 3 stated turn 2; with row 2 gone it is turn 1 (a stated turn is then a bad row too).
    assert trace.skipped_rows == 2 and len(trace) == 1
    rows[2].pop("turn")
    trace = load_trace(write(tmp_path, rows), skip_bad_rows=True)
    assert trace.table.column("turn").to_pylist() == [0, 1] and trace.skipped_rows == 1


def test_empty_file_says_so(tmp_path):
    path = write(tmp_path, ["", "  "])
    with pytest.raises(TraceError) as info:
        load_trace(path, format="jsonl")
    one_line(info, "no requests", "has no rows")

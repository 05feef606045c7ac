"""The qwen-bailian loader (`kvsim.traces.bailian`) on the hand-made sample in
tests/data/qwen-bailian/ (its README says what each row is for), and its bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import in_process

from kvsim.errors import TraceError
from kvsim.traces import block_hashes, load_trace, read_trace, segment_columns, validate_trace
from kvsim.traces.convert import convert_to_parquet
from kvsim.traces.formats import detect_format
from kvsim.traces.registry import open_source

SAMPLE = Path(__file__).resolve().parent / "data" / "qwen-bailian" / "sample.jsonl"
GOOD = {
    "chat_id": 7,
    "parent_chat_id": -1,
    "timestamp": 1.5,
    "input_length": 20,
    "output_length": 5,
    "type": "text",
    "turn": 1,
    "hash_ids": [3, 4],
}


def col(trace, name: str) -> list:
    return trace.table.column(name).to_pylist()


def write(tmp: Path, rows: list[dict | str], name: str = "b.jsonl") -> Path:
    path = tmp / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_sample_is_detected_and_every_column_has_its_worked_value():
    assert detect_format(SAMPLE) == "qwen-bailian"
    tr = load_trace(SAMPLE)
    validate_trace(tr.table, "sample")
    assert tr.native_block_size == 16 and tr.skipped_rows == 0
    # Canonical order is (arrival, chat_id): 107 is listed out of time order, 114 and 115 tie.
    assert col(tr, "request_id") == [101, 103, 104, 105, 107, 109, 110, 112, 114, 115, 117, 120]
    assert col(tr, "arrival_s") == [0.0, 2.0, 5.5, 12.5, 20.0, 30.25, 35.0, 40.0, 50.0, 50.0,
                                    61.0, 70.0]  # fmt: skip
    # Sessions are parent chains, named by their root; 120's parent 99 is not in the file.
    assert col(tr, "session_id") == [101, 103, 104, 101, 107, 101, 103, 101, 103, 115, 101, 120]
    assert col(tr, "turn") == [0, 0, 0, 1, 0, 2, 1, 3, 2, 0, 4, 0]
    # 112 answers 101 again: its parent is 101, not the turn before it (105).
    assert col(tr, "parent_id") == [-1, -1, -1, 101, -1, 105, 103, 101, 110, -1, 109, -1]
    assert col(tr, "category") == ["text", "file", "search", "text", "image", "text", "file",
                                   "text", "file", "search", "text", "text"]  # fmt: skip
    assert col(tr, "tool_wait_s") == [None] * 12
    assert col(tr, "think_time_s") == [None] * 12
    assert col(tr, "input_tokens") == [40, 100, 33, 72, 256, 120, 160, 68, 200, 16, 160, 17]
    # output_length 0 (115) is kept with 1 token: it still held a prefill.
    assert col(tr, "output_tokens") == [20, 50, 80, 30, 90, 16, 60, 25, 70, 1, 40, 10]
    assert col(tr, "output_hash") == [0] * 12


def test_segments_follow_hash_ids_and_shared_ids_share_blocks():
    tr = load_trace(SAMPLE)
    seg = segment_columns(tr.table)
    row = {rid: i for i, rid in enumerate(col(tr, "request_id"))}

    def segments(rid: int) -> tuple[list[int], list[int]]:
        a, b = seg.offsets[row[rid]], seg.offsets[row[rid] + 1]
        return seg.hashes[a:b].tolist(), seg.tokens[a:b].tolist()

    def blocks(rid: int) -> list[int]:
        hashes, tokens = segments(rid)
        return block_hashes(np.array(hashes, np.uint64), np.array(tokens), 16).tolist()

    # 101: 40 tokens in ids [1, 2, 3]: two full blocks and a last one of 8.
    hashes, tokens = segments(101)
    assert tokens == [16, 16, 8] and len(set(hashes)) == 3
    assert set(seg.kinds.tolist()) == {5}  # opaque
    # 105 = [1, 2, 4, 5, 6]: shares ids 1, 2 (32 tokens) with 101, so their first two blocks.
    assert segments(105)[0][:2] == hashes[:2] and segments(105)[1] == [16, 16, 16, 16, 8]
    # Only full blocks are cached: 101 has 2 (40 tokens), 105 4, 109 7, 117 10. Each prompt
    # repeats the earlier one's full blocks and replaces its partial last block.
    b101, b105, b109, b117 = blocks(101), blocks(105), blocks(109), blocks(117)
    assert [len(b) for b in (b101, b105, b109, b117)] == [2, 4, 7, 10]
    assert b105[:2] == b101 and b109[:4] == b105 and b117[:7] == b109
    assert b109[4] not in b105 and b117[7] not in b109  # id 7 after 6; id 11 after 10
    # 115 is one block of id 1: the same first block as every prompt of the text chat.
    assert blocks(115) == b101[:1]
    # The file chat: 103 → 110 repeats 6 blocks, 110 → 114 repeats 9 of 10 (id 31, not 30).
    b103, b110, b114 = blocks(103), blocks(110), blocks(114)
    assert [len(b) for b in (b103, b110, b114)] == [6, 10, 12]
    assert b110[:6] == b103 and b114[:9] == b110[:9] and b114[9] != b110[9]
    assert not set(b103) & set(b101)


def test_options_and_conversion_keep_the_hint_columns(tmp_path):
    # rate_scale halves session starts; a session keeps its own gaps (105 stays 12.5 s after 101).
    head = load_trace(SAMPLE, max_requests=5, rate_scale=2.0)
    assert col(head, "request_id") == [101, 103, 104, 107, 105]
    assert col(head, "arrival_s") == [0.0, 1.0, 2.75, 10.0, 12.5]
    assert col(head, "parent_id") == [-1, -1, -1, -1, 101]
    assert col(head, "category") == ["text", "file", "search", "image", "text"]
    out = tmp_path / "s.parquet"
    assert convert_to_parquet(open_source(SAMPLE), out) == (12, 0)
    back = read_trace(out)
    assert back.table.equals(load_trace(SAMPLE).table)


def test_mooncake_rows_are_not_taken_for_bailian(tmp_path):
    mooncake = {k: GOOD[k] for k in ("timestamp", "input_length", "output_length")}
    path = write(tmp_path, [{**mooncake, "hash_ids": [1]}], "m.jsonl")
    assert detect_format(path) == "mooncake"
    assert detect_format(write(tmp_path, [GOOD], "q.jsonl")) == "qwen-bailian"


BAD_ROWS = [
    ({"chat_id": None}, "chat_id", "missing"),
    ({"chat_id": -3}, "chat_id", "an integer in [0, 2^63)"),
    ({"chat_id": 2.5}, "chat_id", "an integer in [0, 2^63)"),
    ({"parent_chat_id": -2}, "parent_chat_id", "a chat_id or -1"),
    ({"parent_chat_id": "5"}, "parent_chat_id", "a chat_id or -1"),
    ({"parent_chat_id": 7}, "parent_chat_id", "another request's chat_id"),
    ({"timestamp": -0.5}, "timestamp", "a non-negative number of seconds"),
    ({"timestamp": "0"}, "timestamp", "a non-negative number of seconds"),
    ({"input_length": 0}, "input_length", "an integer in [1,"),
    ({"input_length": 20.0}, "input_length", "an integer in [1,"),
    ({"output_length": -1}, "output_length", "an integer in [0,"),
    ({"type": 3}, "type", "a string"),
    ({"turn": -1}, "turn", "a non-negative integer"),
    ({"hash_ids": [3, -4]}, "hash_ids", "a list of integers"),
    ({"hash_ids": "3,4"}, "hash_ids", "a list of integers"),
    # 20 tokens are ceil(20 / 16) = 2 blocks, not 3 (nor 1: 17 tokens need a second block).
    ({"hash_ids": [3, 4, 5]}, "hash_ids", "ceil(input_length / 16) = 2 ids, got '3 ids'"),
    ({"input_length": 33}, "hash_ids", "ceil(input_length / 16) = 3 ids, got '2 ids'"),
]


def bad_row(change: dict) -> dict:
    row = {**GOOD, **change}
    return {k: v for k, v in row.items() if v is not None}


@pytest.mark.parametrize(("change", "field", "fragment"), BAD_ROWS)
def test_a_bad_row_is_one_line_naming_file_line_and_field(tmp_path, change, field, fragment):
    path = write(tmp_path, [{**GOOD, "chat_id": 1}, bad_row(change)])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: field {field!r}: ") and "\n" not in message
    assert fragment in message


def test_bad_rows_across_rows(tmp_path):
    twice = write(tmp_path, [GOOD, {**GOOD, "timestamp": 2.0}], "twice.jsonl")
    with pytest.raises(TraceError, match=r"twice\.jsonl:2: field 'chat_id': expected a unique "
                                         r"id \(line 1 has it\), got 7"):  # fmt: skip
        load_trace(twice)
    # A reply to a request that arrives after it.
    early = write(tmp_path, [{**GOOD, "chat_id": 8, "parent_chat_id": 7, "timestamp": 1.0}, GOOD],
                  "early.jsonl")  # fmt: skip
    want = r"early\.jsonl:1: field 'parent_chat_id': expected a request that arrives before"
    with pytest.raises(TraceError, match=want + r" this one, got 7"):
        load_trace(early)


def test_skip_bad_rows_counts_and_children_of_a_skipped_row_start_over(tmp_path):
    path = write(tmp_path, [
        {**GOOD, "chat_id": 1, "timestamp": 0.0},
        {**GOOD, "chat_id": 2, "parent_chat_id": 1, "timestamp": 1.0, "hash_ids": [3]},  # bad
        {**GOOD, "chat_id": 3, "parent_chat_id": 2, "timestamp": 2.0},
        {**GOOD, "chat_id": 4, "parent_chat_id": 3, "timestamp": 3.0},
        "not json",
        {**GOOD, "chat_id": 4, "timestamp": 4.0},  # repeats 4
        {**GOOD, "chat_id": 6, "parent_chat_id": 1, "timestamp": 5.0, "type": "search"},
    ])  # fmt: skip
    tr = load_trace(path, skip_bad_rows=True)
    assert tr.skipped_rows == 3
    assert col(tr, "request_id") == [1, 3, 4, 6]
    # 3 lost its parent 2: it starts a session of its own, which 4 continues.
    assert col(tr, "session_id") == [1, 3, 3, 1]
    assert col(tr, "turn") == [0, 0, 1, 1]
    assert col(tr, "parent_id") == [-1, -1, 3, 1]
    assert col(tr, "category") == ["text", "text", "text", "search"]
    with pytest.raises(TraceError, match=r"no requests: all 2 rows were malformed and skipped"):
        load_trace(write(tmp_path, ["[]", {"chat_id": 1}], "none.jsonl"), skip_bad_rows=True)


@pytest.mark.parametrize("command", ["stats", "run"])
def test_cli_exits_2_with_one_line_and_no_traceback(tmp_path, capsys, command):
    path = write(tmp_path, [GOOD, bad_row({"hash_ids": [1]})])
    args = ["trace", "stats", str(path)] if command == "stats" else [
        "run", "--trace", str(path), "--out", str(tmp_path / "out")]  # fmt: skip
    code, _, err = in_process(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert f"{path}:2: field 'hash_ids': expected ceil(input_length / 16) = 2 ids" in lines[0]


def test_cli_stats_reads_the_sample(capsys):
    code, out, _ = in_process(capsys, "trace", "stats", str(SAMPLE), "--json")
    assert code == 0
    figures = json.loads(out)
    assert figures["requests"] == 12 and figures["sessions"] == 6

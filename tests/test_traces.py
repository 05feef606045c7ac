"""Trace loaders, the sharegpt generator, the canonical schema and the registry."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from kvsim.errors import KvsimError, TraceError, UnknownNameError
from kvsim.traces import (
    SEGMENT_KINDS,
    TRACE_SCHEMA,
    block_hashes,
    load_trace,
    read_trace,
    segment_columns,
    sequence_block_hashes,
    trace_names,
    traces_dir,
    validate_trace,
    write_trace,
)
from kvsim.traces.sharegpt import ShareGPTParams, generate_sharegpt, read_first_turn_tokens

SHAREGPT_SAMPLE = traces_dir() / "sharegpt" / "ShareGPT_V3_filtered_500.json"


@pytest.fixture(scope="module")
def conversation():
    return load_trace("mooncake-conversation")


@pytest.fixture(scope="module")
def first_turns():
    return read_first_turn_tokens(SHAREGPT_SAMPLE)


@pytest.fixture(scope="module")
def big_sharegpt(first_turns):
    return generate_sharegpt(first_turns, ShareGPTParams(sessions=20_000), seed=7)


def col(trace, name):
    return trace.table.column(name).to_numpy(zero_copy_only=False)


# --- registry -------------------------------------------------------------------------------


def test_names():
    assert trace_names() == [
        "agentic",
        "azure-code",
        "azure-conv",
        "lmsys",
        "mooncake-arxiv-1000",
        "mooncake-conversation",
        "mooncake-synthetic",
        "mooncake-toolagent",
        "pi-coding-agent",
        "sharegpt",
    ]


def test_every_named_trace_is_canonical():
    for name in trace_names():
        trace = load_trace(name, max_requests=200)
        assert trace.table.schema.remove_metadata().equals(TRACE_SCHEMA)
        validate_trace(trace.table, name)
        assert trace.name == name
        assert len(trace) == min(200, len(load_trace(name)))
        assert trace.description


def test_unknown_name_lists_valid():
    with pytest.raises(UnknownNameError, match="mooncake-conversation"):
        load_trace("no-such-trace")


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": -1.0}, "rate"),
        ({"rate_scale": 0.0}, "rate_scale"),
        ({"rate_scale": -2.0}, "rate_scale"),
        ({"max_requests": 0}, "max_requests"),
    ],
)
def test_bad_options(kwargs, option):
    with pytest.raises(KvsimError, match=f"'{option}'"):
        load_trace("sharegpt", **kwargs)


def test_env_override(tmp_path, monkeypatch):
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "mooncake_trace_1000.jsonl").write_text(
        '{"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": [9]}\n'
    )
    monkeypatch.setenv("KVSIM_TRACES", str(tmp_path))
    trace = load_trace("mooncake-arxiv-1000")
    assert len(trace) == 1 and col(trace, "input_tokens").tolist() == [3]


# --- Mooncake --------------------------------------------------------------------------------


def test_conversation_matches_provenance(conversation):
    t = conversation
    assert len(t) == 12_031
    assert t.native_block_size == 512
    assert abs(col(t, "input_tokens").mean() - 12_035) <= 1
    assert round(col(t, "output_tokens").mean(), 1) == 342.6
    assert np.median(col(t, "input_tokens")) == 6_909
    assert len(np.unique(segment_columns(t.table).hashes)) == 182_790
    assert col(t, "arrival_s").max() == pytest.approx(3_536.999)
    assert (col(t, "turn") == 0).all() and np.isnan(col(t, "think_time_s")).all()
    assert (col(t, "output_hash") == 0).all()


def test_other_mooncake_files_match_provenance():
    arxiv = load_trace("mooncake-arxiv-1000")
    assert len(arxiv) == 1_000
    assert round(col(arxiv, "input_tokens").mean()) == 9_792
    synthetic = load_trace("mooncake-synthetic")
    assert len(synthetic) == 3_993
    assert round(col(synthetic, "input_tokens").mean()) == 15_325
    assert round(col(synthetic, "output_tokens").mean(), 1) == 149.1


def test_mooncake_segments(conversation):
    seg = segment_columns(conversation.table)
    inputs = col(conversation, "input_tokens")
    counts = np.diff(seg.offsets)
    assert (counts == -(-inputs // 512)).all()
    last = seg.tokens[seg.offsets[1:] - 1]
    assert (last == inputs - 512 * (counts - 1)).all()
    assert set(seg.kinds.tolist()) == {SEGMENT_KINDS.index("opaque")}


def test_segment_columns_of_a_slice_and_of_chunks(conversation):
    """A single chunk is read in place (a window's slice), sliced or not, and gives what the
    same rows copied into one fresh chunk, or split over several chunks, give."""
    whole = segment_columns(conversation.table)
    lo, hi = 7, 40
    copied = pa.Table.from_pylist(conversation.table.slice(lo, hi - lo).to_pylist(),
                                  schema=conversation.table.schema)  # fmt: skip
    chunked = pa.concat_tables([conversation.table.slice(lo, 10),
                                conversation.table.slice(lo + 10, hi - lo - 10)])  # fmt: skip
    assert chunked.column("segments").num_chunks == 2
    a, b = whole.offsets[lo], whole.offsets[hi]
    for table in (conversation.table.slice(lo, hi - lo), copied, chunked):
        seg = segment_columns(table)
        assert seg.offsets.tolist() == (whole.offsets[lo : hi + 1] - a).tolist()
        for name in ("hashes", "tokens", "kinds"):
            assert getattr(seg, name).tolist() == getattr(whole, name)[a:b].tolist(), name
            assert getattr(seg, name).dtype == getattr(whole, name).dtype, name


def test_mooncake_shared_prefix_gives_equal_block_hashes(conversation):
    """Rows 0 and 1 start with the same hash id (0): their first 512-token block is shared."""
    seg = segment_columns(conversation.table)
    rows = conversation.table.slice(0, 2)
    assert rows.column("request_id").to_pylist() == [0, 1]

    def blocks(i, size):
        a, b = seg.offsets[i], seg.offsets[i + 1]
        return block_hashes(seg.hashes[a:b], seg.tokens[a:b], size)

    for size in (16, 128, 512):
        shared = 512 // size
        assert blocks(0, size)[:shared].tolist() == blocks(1, size)[:shared].tolist()
        assert blocks(0, size)[shared] != blocks(1, size)[shared]


def test_max_requests_keeps_first_rows(conversation):
    head = load_trace("mooncake-conversation", max_requests=100)
    assert head.table.equals(conversation.table.slice(0, 100))


def test_rate_scale_and_rate():
    base = col(load_trace("mooncake-arxiv-1000"), "arrival_s")
    fast = col(load_trace("mooncake-arxiv-1000", rate_scale=2.0), "arrival_s")
    assert np.allclose(fast, base / 2)
    paced = col(load_trace("mooncake-arxiv-1000", rate=10.0), "arrival_s")
    assert 1_000 / paced.max() == pytest.approx(10.0)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


@pytest.mark.parametrize(
    ("bad", "field", "fragment"),
    [
        ({"timestamp": 1, "output_length": 5, "hash_ids": [1]}, "input_length", "missing"),
        ({**GOOD, "input_length": -3, "hash_ids": []}, "input_length", "positive integer"),
        ({**GOOD, "input_length": "600"}, "input_length", "positive integer"),
        ({**GOOD, "input_length": 0, "hash_ids": []}, "input_length", "prompt of >= 1 token"),
        ({**GOOD, "input_length": 10**12}, "input_length", "at most 100,000,000 tokens"),
        ({**GOOD, "output_length": 10**9}, "output_length", "at most 100,000,000 tokens"),
        ({**GOOD, "hash_ids": [1, 2**64]}, "hash_ids", "non-negative integers below 2^64"),
        ({**GOOD, "timestamp": 10**400}, "timestamp", "non-negative number"),
        ({**GOOD, "timestamp": "soon"}, "timestamp", "non-negative number"),
        ({**GOOD, "output_length": 0}, "output_length", "positive integer"),
        ({**GOOD, "hash_ids": [1, 2, 3]}, "hash_ids", "= 2 ids"),
        ({**GOOD, "hash_ids": [1, "x"]}, "hash_ids", "non-negative integers"),
    ],
)
def test_malformed_mooncake_rows_name_file_line_field(tmp_path, bad, field, fragment):
    path = write_jsonl(tmp_path / "x.jsonl", [GOOD, GOOD, bad])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: field '{field}'")
    assert fragment in message


def test_malformed_json_line(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [GOOD, "{oops"])
    with pytest.raises(TraceError, match=r"x\.jsonl:2: not valid JSON"):
        load_trace(path)


def test_named_trace_errors_show_repo_relative_path(tmp_path, monkeypatch):
    root = tmp_path / "traces"
    (root / "mooncake").mkdir(parents=True)
    write_jsonl(root / "mooncake" / "synthetic_trace.jsonl", [{**GOOD, "input_length": -1}])
    monkeypatch.setenv("KVSIM_TRACES", str(root))
    with pytest.raises(TraceError, match=r"^traces/mooncake/synthetic_trace\.jsonl:1: field"):
        load_trace("mooncake-synthetic")


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "absent.jsonl")


# --- canonical table: Parquet and validation -------------------------------------------------


def test_parquet_round_trip_loses_nothing(tmp_path):
    for name in ("sharegpt", "mooncake-arxiv-1000"):
        trace = load_trace(name)
        path = tmp_path / f"{name}.parquet"
        write_trace(trace, path)
        back = read_trace(path)
        assert back.table.equals(trace.table)
        assert back.table.schema.equals(trace.table.schema, check_metadata=True)
        assert (back.name, back.native_block_size, back.description) == (
            trace.name,
            trace.native_block_size,
            trace.description,
        )
        via_registry = load_trace(path, max_requests=10)
        assert via_registry.table.equals(trace.table.slice(0, 10))


def test_first_requests_of_a_file_read_only_their_row_groups(tmp_path):
    """`--max-requests` on a long file reads the row groups that hold the first N rows: the same
    table as reading it all, and a bad row further on is not reached, even in the row group of
    the last row kept (only the rows kept are checked, wherever the row groups end)."""
    import pyarrow.parquet as pq

    table = load_trace("mooncake-arxiv-1000").table
    out = table.column("output_tokens").to_numpy().copy()
    out[700] = -1
    bad = table.set_column(
        table.schema.get_field_index("output_tokens"),
        table.schema.field("output_tokens"),
        pa.array(out, table.schema.field("output_tokens").type),
    )
    path = tmp_path / "groups.parquet"
    pq.write_table(bad, path, row_group_size=100)
    for n in (1, 99, 100, 101, 650, 700):
        assert load_trace(path, max_requests=n).table.equals(table.slice(0, n))
    with pytest.raises(TraceError, match=r"row 700.*output_tokens"):
        load_trace(path, max_requests=701)
    with pytest.raises(TraceError, match=r"row 700.*output_tokens"):
        load_trace(path)


def test_validation_names_row_and_field():
    table = load_trace("mooncake-arxiv-1000", max_requests=5).table
    validate_trace(table, "ok")

    out = table.column("output_tokens").to_numpy().copy()
    out[3] = 0
    bad = table.set_column(6, TRACE_SCHEMA.field(6), pa.array(out, pa.int32()))
    with pytest.raises(TraceError, match=r"^src: row 3: field 'output_tokens'"):
        validate_trace(bad, "src")

    inputs = table.column("input_tokens").to_numpy().copy()
    inputs[2] += 1
    bad = table.set_column(5, TRACE_SCHEMA.field(5), pa.array(inputs, pa.int32()))
    with pytest.raises(TraceError, match=r"row 2: field 'input_tokens'"):
        validate_trace(bad, "src")

    with pytest.raises(TraceError, match=r"row 1: field 'arrival_s'"):
        validate_trace(table.take([1, 0, 2]), "src")

    with pytest.raises(TraceError, match="field 'output_hash': missing"):
        validate_trace(table.drop_columns(["output_hash"]), "src")


def test_validation_rejects_turn_without_its_past():
    trace = load_trace("sharegpt")
    turn = col(trace, "turn")
    later = int(np.flatnonzero(turn == 1)[0])
    session = col(trace, "session_id")[later]
    earlier = int(np.flatnonzero((col(trace, "session_id") == session) & (turn == 0))[0])
    keep = [i for i in range(len(trace)) if i != earlier]
    with pytest.raises(TraceError, match="field 'turn'"):
        validate_trace(trace.table.take(keep), "src")


# --- sharegpt generator ----------------------------------------------------------------------


def test_sharegpt_default_size_and_determinism():
    a, b = load_trace("sharegpt"), load_trace("sharegpt")
    assert a.table.equals(b.table)
    assert 2_500 <= len(a) <= 3_500  # 855 sessions of 3.51 turns: the issue-13 scenario
    assert not a.table.equals(load_trace("sharegpt", seed=1).table)
    assert a.native_block_size is None


def test_sharegpt_max_requests_keeps_whole_history():
    full = load_trace("sharegpt")
    head = load_trace("sharegpt", max_requests=300)
    assert head.table.equals(full.table.slice(0, 300))
    validate_trace(head.table, "head")  # checks that every turn's earlier turns are present
    more = load_trace("sharegpt", max_requests=6_000)  # more than the default: sessions added
    assert len(more) == 6_000
    validate_trace(more.table, "more")


def test_sharegpt_rate_controls_session_arrivals():
    def first_turn_arrivals(**kwargs):
        trace = load_trace("sharegpt", **kwargs)
        return np.sort(col(trace, "arrival_s")[col(trace, "turn") == 0])

    slow, fast = first_turn_arrivals(rate=0.5), first_turn_arrivals(rate=0.5, rate_scale=4.0)
    assert np.allclose(fast, slow / 4)
    n = slow.size
    assert (n - 1) / slow[-1] == pytest.approx(0.5, rel=0.15)


def test_sharegpt_turn_structure():
    """Turn k+1's prompt is turn k's prompt + its reply + one new user message."""
    trace = load_trace("sharegpt")
    rows = trace.table.to_pylist()
    by_key = {(r["session_id"], r["turn"]): r for r in rows}
    checked = 0
    for (session, turn), row in by_key.items():
        if turn == 0:
            assert row["think_time_s"] is None
            assert [s["kind"] for s in row["segments"]] == ["user"]
            continue
        prev = by_key[(session, turn - 1)]
        assert row["think_time_s"] > 0
        assert row["arrival_s"] > prev["arrival_s"]
        reply = {"hash": prev["output_hash"], "tokens": prev["output_tokens"], "kind": "assistant"}
        assert row["segments"][:-1] == [*prev["segments"], reply]
        assert row["segments"][-1]["kind"] == "user"
        assert (
            row["input_tokens"]
            == prev["input_tokens"] + prev["output_tokens"] + (row["segments"][-1]["tokens"])
        )

        def arr(segments):
            hashes = np.array([s["hash"] for s in segments], np.uint64)
            return hashes, np.array([s["tokens"] for s in segments])

        cached = sequence_block_hashes(
            *arr(prev["segments"]), prev["output_hash"], prev["output_tokens"], 16
        )
        now = block_hashes(*arr(row["segments"]), 16)
        assert now[: cached.size].tolist() == cached.tolist()
        checked += 1
    assert checked > 300


def test_sharegpt_system_prompt_is_shared(first_turns):
    trace = generate_sharegpt(first_turns, ShareGPTParams(sessions=20, system_prompt_tokens=64))
    validate_trace(trace.table, "sys")
    firsts = [r["segments"][0] for r in trace.table.to_pylist()]
    assert {(s["hash"], s["tokens"], s["kind"]) for s in firsts} == {
        (firsts[0]["hash"], 64, "system")
    }


def test_first_turn_lengths_come_from_real_sample(big_sharegpt, first_turns):
    assert first_turns.size == 500
    first = col(big_sharegpt, "input_tokens")[col(big_sharegpt, "turn") == 0]
    assert set(first.tolist()) <= set(first_turns.tolist())
    raw = json.loads(SHAREGPT_SAMPLE.read_text())
    chars = np.array([len(c["conversations"][0]["value"]) for c in raw])
    assert first_turns.tolist() == np.maximum(1, np.ceil(chars / 4)).astype(int).tolist()


def test_sharegpt_statistics_match_targets(big_sharegpt):
    """20k sessions: turns, later user messages and replies near the published figures."""
    t = big_sharegpt
    turn = col(t, "turn")
    sessions = np.unique(col(t, "session_id")).size
    assert len(t) / sessions == pytest.approx(3.51, rel=0.03)

    reply = col(t, "output_tokens")
    assert reply.mean() == pytest.approx(348.45, rel=0.03)
    assert reply.std() == pytest.approx(269.93, rel=0.06)
    assert reply.min() >= 1 and reply.max() <= 4096

    seg = segment_columns(t.table)
    last_user = seg.tokens[seg.offsets[1:] - 1][turn > 0]
    assert last_user.mean() == pytest.approx(94.46, rel=0.12)
    # Heavy tail: median far below the mean (moment-matched lognormal median is about 14).
    assert np.median(last_user) == pytest.approx(14, abs=2)

    think = col(t, "think_time_s")[turn > 0]
    assert think.mean() == pytest.approx(30.0, rel=0.03)

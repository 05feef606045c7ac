"""Issue 10, trace inputs: every loader refuses zero-token prompts, implausible counts, non-UTF-8
bytes and unreadable files with one line naming file and row; every format counts what
`skip_bad_rows` left out; implausible time spans warn; an empty chat source says why."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from inputs import deny_reading, one_line

from kvsim.errors import KvsimError, TraceError, UnknownNameError
from kvsim.traces import load_trace, make_trace_table, read_trace, traces_dir, write_trace
from kvsim.traces.cli import trace as trace_cli
from kvsim.traces.convert import convert_to_parquet
from kvsim.traces.registry import detect_format, open_source
from kvsim.traces.schema import KIND_CODES, MAX_REQUEST_TOKENS, Trace

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:15:{s:02d}.6805900,{ctx},{gen}\n"
BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


# --- one small file per format, with one row whose prompt (or other field) we choose -------------


def mooncake(tmp: Path, bad: dict | None = None, name: str = "m.jsonl") -> Path:
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    rows = [good, {**good, "timestamp": 10}, {**good, "timestamp": 20, **(bad or {})}]
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def azure(tmp: Path, ctx: str = "12", gen: str = "3") -> Path:
    path = tmp / "a.csv"
    rows = [AZURE_ROW.format(s=1, ctx=40, gen=5), AZURE_ROW.format(s=2, ctx=50, gen=6)]
    path.write_text(AZURE_HEAD + "".join(rows) + AZURE_ROW.format(s=3, ctx=ctx, gen=gen))
    return path


def burstgpt(tmp: Path, req: str = "12", resp: str = "3") -> Path:
    path = tmp / "b.csv"
    rows = "1,ChatGPT,40,5,45,Conversation log\n2,ChatGPT,50,6,56,Conversation log\n"
    path.write_text(BURST_HEAD + rows + f"3,ChatGPT,{req},{resp},9,Conversation log\n")
    return path


def dynamo(tmp: Path, n_in: int = 20, n_out: int = 4) -> Path:
    def event(ts: int, session: str, n_in: int, n_out: int) -> dict:
        blocks = -(-n_in // 16) if n_in < 10**6 else 1  # a huge count: the count is what is wrong
        replay = {"trace_block_size": 16, "input_sequence_hashes": list(range(1, blocks + 1))}
        request = {"input_tokens": n_in, "output_tokens": n_out, "replay": replay}
        return {"timestamp": ts, "event": {"event_type": "request_end", "request": request,
                                           "agent_context": {"session_id": session}}}  # fmt: skip

    rows = [event(1000, "a", 40, 5), event(2000, "b", 50, 6), event(3000, "c", n_in, n_out)]
    path = tmp / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def jsonl(tmp: Path, bad: dict | None = None) -> Path:
    good = {"arrival_s": 0.0, "output_tokens": 5, "segments": [{"hash": 1, "tokens": 40}]}
    rows = [good, {**good, "arrival_s": 1.0}, {**good, "arrival_s": 2.0, **(bad or {})}]
    path = tmp / "k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def canonical(tmp: Path, inputs: tuple[int, int, int] = (40, 50, 12)) -> Path:
    """Three single-turn requests; a 0-token prompt has no segments (as a loader would build)."""
    counts = np.array([1 if n else 0 for n in inputs])
    table = make_trace_table(
        request_id=np.arange(3), session_id=np.arange(3), turn=np.zeros(3, np.int32),
        arrival_s=np.arange(3.0), think_time_s=None, input_tokens=np.array(inputs),
        output_tokens=np.array([5, 6, 3]), seg_offsets=np.concatenate(([0], np.cumsum(counts))),
        seg_hashes=np.arange(1, counts.sum() + 1, dtype=np.uint64),
        seg_tokens=np.array([n for n in inputs if n]),
        seg_kinds=np.full(counts.sum(), KIND_CODES["user"], np.uint8),
        output_hash=np.zeros(3, np.uint64), name="c", native_block_size=None, description="",
    )  # fmt: skip
    path = tmp / "c.parquet"
    pq.write_table(table, path)
    return path


#: (format, writer of a file whose third row has a 0-token prompt, field named in the error)
ZERO_PROMPT: list[tuple[str, Callable[[Path], Path], str]] = [
    ("mooncake", lambda t: mooncake(t, {"input_length": 0, "hash_ids": []}), "input_length"),
    ("azure", lambda t: azure(t, ctx="0"), "ContextTokens"),
    ("burstgpt", lambda t: burstgpt(t, req="0"), "Request tokens"),
    ("dynamo", lambda t: dynamo(t, n_in=0), "request.input_tokens"),
    ("canonical", lambda t: canonical(t, (40, 50, 0)), "input_tokens"),
    ("jsonl", lambda t: jsonl(t, {"segments": [{"hash": 1, "tokens": 0}]}), "tokens"),
]
#: The same with a count of 10^12 tokens (the issue's pyarrow int32 overflow).
HUGE_COUNT: list[tuple[str, Callable[[Path], Path], str]] = [
    ("mooncake", lambda t: mooncake(t, {"input_length": 10**12}), "input_length"),
    ("mooncake", lambda t: mooncake(t, {"output_length": 10**12}), "output_length"),
    ("azure", lambda t: azure(t, ctx=str(10**12)), "ContextTokens"),
    ("azure", lambda t: azure(t, gen=str(10**12)), "GeneratedTokens"),
    ("azure", lambda t: azure(t, ctx="9" * 30), "ContextTokens"),  # past int64 too
    ("burstgpt", lambda t: burstgpt(t, req=str(10**12)), "Request tokens"),
    ("burstgpt", lambda t: burstgpt(t, resp=str(10**12)), "Response tokens"),
    ("dynamo", lambda t: dynamo(t, n_in=10**12), "request.input_tokens"),
    ("jsonl", lambda t: jsonl(t, {"output_tokens": 10**12}), "output_tokens"),
    ("jsonl", lambda t: jsonl(t, {"segments": [[1, 10**12]]}), "tokens"),
]
ROW = {"mooncake": ":3:", "azure": ":4:", "burstgpt": ":4:", "dynamo": ":3:", "canonical": "row 2",
       "jsonl": ":3:"}  # fmt: skip


# --- item 1: zero-token prompts, and item 4: implausible counts ---------------------------------


@pytest.mark.parametrize(("fmt", "write", "field"), ZERO_PROMPT + HUGE_COUNT)
def test_bad_count_is_refused_naming_file_and_row(tmp_path, fmt, write, field):
    path = write(tmp_path)
    assert detect_format(path) == fmt
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, path.name, ROW[fmt], field)


@pytest.mark.parametrize(("fmt", "write", "field"), ZERO_PROMPT + HUGE_COUNT)
def test_bad_count_is_skipped_and_counted(tmp_path, fmt, write, field):
    trace = load_trace(write(tmp_path), skip_bad_rows=True)
    assert len(trace) == 2 and trace.skipped_rows == 1
    assert trace.table.column("input_tokens").to_numpy().min() >= 1


@pytest.mark.parametrize(("fmt", "write", "field"), ZERO_PROMPT)
def test_trace_convert_applies_the_same_rule(tmp_path, fmt, write, field):
    path = write(tmp_path)
    with pytest.raises(TraceError) as info:
        convert_to_parquet(open_source(path), tmp_path / "out.parquet")
    one_line(info, ROW[fmt], field)
    written, skipped = convert_to_parquet(open_source(path, skip_bad_rows=True),
                                          tmp_path / "out.parquet")  # fmt: skip
    assert (written, skipped) == (2, 1)
    back = read_trace(tmp_path / "out.parquet")
    assert back.skipped_rows == 1 and len(back) == 2
    res = CliRunner().invoke(trace_cli, ["convert", str(path), "-o", str(tmp_path / "x.parquet")])
    assert isinstance(res.exception, TraceError) and ROW[fmt] in str(res.exception)


def test_generated_tables_cannot_overflow_int32():
    """The last line of defence: a count past the bound is a TraceError, not an ArrowInvalid."""
    with pytest.raises(TraceError, match=r"gen: request 1: field 'output_tokens'"):
        make_trace_table(
            request_id=np.arange(2), session_id=np.arange(2), turn=np.zeros(2),
            arrival_s=np.zeros(2), think_time_s=None, input_tokens=np.array([1, 1]),
            output_tokens=np.array([1, MAX_REQUEST_TOKENS + 1]), seg_offsets=np.array([0, 1, 2]),
            seg_hashes=np.array([1, 2], np.uint64), seg_tokens=np.array([1, 1]),
            seg_kinds=np.zeros(2, np.uint8), output_hash=np.zeros(2, np.uint64), name="gen",
            native_block_size=None, description="",
        )  # fmt: skip


def test_azure_impossible_date_names_line(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(AZURE_HEAD + AZURE_ROW.format(s=1, ctx=4, gen=5)
                    + "2023-13-45 18:15:46.6805900,5,5\n")  # fmt: skip
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, "a.csv:3: field 'TIMESTAMP'", "2023-13-45")
    assert load_trace(path, skip_bad_rows=True).skipped_rows == 1


def test_chat_text_over_the_bound_drops_its_conversation(tmp_path, monkeypatch):
    """A text source's request size is its whole history: the conversation is the bad row."""
    import kvsim.traces.common as common

    monkeypatch.setattr(common, "MAX_REQUEST_TOKENS", 100)  # 10^8 tokens of text is 400 MB
    convs = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
        {"conversations": [{"from": "human", "value": "x" * 800}, {"from": "gpt", "value": "k"}]},
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(convs, indent=1))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, "s.json:", "implausible")
    trace = load_trace(path, skip_bad_rows=True)
    assert len(trace) == 1 and trace.skipped_rows == 1


# --- item 3: bytes that are not UTF-8 -------------------------------------------------------------


def _sharegpt_bytes() -> bytes:
    convs = [{"conversations": [{"from": "human", "value": "hello"},
                                {"from": "gpt", "value": "REPLY"}]}] * 3  # fmt: skip
    return json.dumps(convs, indent=1).encode()


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("s.json", _sharegpt_bytes().replace(b"REPLY", b"\xff\xfe", 1), "s.json:10"),
        ("a.csv", (AZURE_HEAD + "2023-11-16 18:15:01.1,4,5\n").encode().replace(b"5\n", b"\xe9\n"),
         "a.csv"),
        ("h.csv", b"TIMESTAMP,Context\xffTokens,GeneratedTokens\n", "h.csv:1"),
        ("b.csv", (BURST_HEAD + "1,Chat\xc3GPT,4,5,9,Conversation log\n").encode("latin-1"),
         "b.csv:2"),
        ("x.traj", b'{"history": [{"role": "system", "content": "\xff"}]}', "x.traj:1"),
    ],
)  # fmt: skip
def test_non_utf8_is_one_line(tmp_path, name, content, where):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, where, "UTF-8")


def test_non_utf8_in_the_shipped_sharegpt_sample_reader(tmp_path, monkeypatch):
    """The `sharegpt` generator reads its sample file whole: the same one line."""
    (tmp_path / "sharegpt").mkdir()
    (tmp_path / "sharegpt" / "ShareGPT_V3_filtered_500.json").write_bytes(b'[{"x": "\xff"}]')
    monkeypatch.setenv("KVSIM_TRACES", str(tmp_path))
    with pytest.raises(TraceError) as info:
        load_trace("sharegpt")
    one_line(info, "ShareGPT_V3_filtered_500.json:1", "not UTF-8")


@pytest.mark.parametrize("fmt", ["mooncake", "jsonl", "dynamo"])
def test_non_utf8_jsonl_line_is_a_bad_row(tmp_path, fmt):
    path = {"mooncake": mooncake, "jsonl": jsonl, "dynamo": dynamo}[fmt](tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1][:-3] + b"\xff" + lines[1][-3:]
    path.write_bytes(b"".join(lines))
    with pytest.raises(TraceError) as info:
        load_trace(path, format=fmt)
    one_line(info, f"{path.name}:2", "not UTF-8")
    assert load_trace(path, format=fmt, skip_bad_rows=True).skipped_rows == 1


# --- item 5: files that cannot be read --------------------------------------------------------


@pytest.mark.parametrize(
    "write",
    [azure, burstgpt, mooncake, dynamo, jsonl,
     lambda t: (t / "s.json").write_bytes(_sharegpt_bytes()) and t / "s.json"],
)  # fmt: skip
def test_permission_denied_is_one_line(tmp_path, monkeypatch, write):
    path = write(tmp_path)
    deny_reading(monkeypatch, path)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, path.name, "Permission denied")


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.json", "t.jsonl.gz"])
def test_directory_in_place_of_a_file(tmp_path, name):
    (tmp_path / name).mkdir()
    with pytest.raises(TraceError) as info:
        load_trace(tmp_path / name)
    one_line(info, name)


def test_corrupt_gzip_is_one_line(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(dynamo(tmp_path).read_bytes())[:-30])
    with pytest.raises(TraceError) as info:
        load_trace(path, format="dynamo")
    one_line(info, "d.jsonl.gz")


def test_empty_trace_name_is_not_the_current_directory():
    with pytest.raises(UnknownNameError):
        load_trace("")
    with pytest.raises(TraceError):
        open_source("  ")


def test_convert_into_a_missing_folder(tmp_path):
    with pytest.raises(KvsimError) as info:
        convert_to_parquet(open_source(azure(tmp_path)), tmp_path / "no" / "x.parquet")
    one_line(info, "does not exist")


# --- item 6: every format counts the rows it skipped --------------------------------------------


def _lmsys(tmp: Path) -> Path:
    item = pa.struct([("content", pa.string()), ("role", pa.string())])
    convs = [[{"content": "hi", "role": "user"}, {"content": "yo", "role": "assistant"}]] * 2
    convs.append([{"content": "hi", "role": "robot"}])
    path = tmp / "l.parquet"
    pq.write_table(pa.table({"conversation_id": ["a", "b", "c"],
                             "conversation": pa.array(convs, pa.list_(item))}), path)  # fmt: skip
    return path


def _sharegpt(tmp: Path) -> Path:
    convs = [*json.loads(_sharegpt_bytes())[:2], {"conversations": "not a list"}]
    path = tmp / "s.json"
    path.write_text(json.dumps(convs))
    return path


def _swe(tmp: Path) -> Path:
    roles = ["system", "user", "assistant", "robot", "tool", "assistant"]
    history = [{"role": role, "content": f"text {i}"} for i, role in enumerate(roles)]
    path = tmp / "x.traj"
    path.write_text(json.dumps({"history": history, "trajectory": []}))
    return path


@pytest.mark.parametrize(
    ("write", "requests"),
    [
        (lambda t: mooncake(t, {"output_length": 0}), 2),  # the issue: Mooncake reported 0
        (lambda t: azure(t, gen="x"), 2),
        (lambda t: burstgpt(t, req="x"), 2),
        (lambda t: dynamo(t, n_in=-1), 2),
        (lambda t: jsonl(t, {"arrival_s": -1}), 2),
        (lambda t: canonical(t, (40, 50, 0)), 2),
        (_sharegpt, 2),
        (_lmsys, 2),
        (_swe, 2),
    ],
)
def test_every_format_counts_skipped_rows(tmp_path, write, requests):
    path = write(tmp_path)
    trace = load_trace(path, skip_bad_rows=True)
    assert (len(trace), trace.skipped_rows) == (requests, 1)
    source = open_source(path, skip_bad_rows=True)
    written, skipped = convert_to_parquet(source, tmp_path / "out.parquet")
    assert (written, skipped) == (requests, 1)
    assert read_trace(tmp_path / "out.parquet").skipped_rows == 1


def test_named_mooncake_trace_honours_skip_bad_rows(tmp_path, monkeypatch):
    folder = tmp_path / "mooncake"
    folder.mkdir()
    mooncake(folder, {"output_length": 0}, name="conversation_trace.jsonl")
    monkeypatch.setenv("KVSIM_TRACES", str(tmp_path))
    with pytest.raises(TraceError, match=r"conversation_trace\.jsonl:3: field 'output_length'"):
        load_trace("mooncake-conversation")
    trace = load_trace("mooncake-conversation", skip_bad_rows=True)
    assert (len(trace), trace.skipped_rows) == (2, 1)


def test_canonical_skip_renumbers_the_rest_of_a_session(tmp_path):
    """Dropping turn 1 of a session leaves turn 2 as the new turn 1, so it still replays."""
    tokens = [10, 0, 30]
    table = make_trace_table(
        request_id=np.arange(3), session_id=np.zeros(3), turn=np.arange(3),
        arrival_s=np.arange(3.0), think_time_s=None, input_tokens=np.array(tokens),
        output_tokens=np.ones(3),
        seg_offsets=np.array([0, 1, 1, 2]), seg_hashes=np.array([1, 2], np.uint64),
        seg_tokens=np.array([10, 30]), seg_kinds=np.zeros(2, np.uint8),
        output_hash=np.zeros(3, np.uint64), name="c", native_block_size=None, description="",
    )  # fmt: skip
    path = tmp_path / "c.parquet"
    write_trace(table, path)
    with pytest.raises(TraceError, match="row 1: field 'input_tokens'"):
        read_trace(path)
    trace = read_trace(path, skip_bad_rows=True)
    assert trace.table.column("turn").to_pylist() == [0, 1]
    assert trace.skipped_rows == 1


# --- item 9: a time span that looks like the wrong unit ---------------------------------------


def test_epoch_millisecond_timestamps_warn(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"timestamp": 1_700_000_000_000 + i, "input_length": 10, "output_length": 5,
             "hash_ids": [i]} for i in range(3)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(path)
    assert len(trace.warnings) == 1
    assert "time unit looks wrong" in trace.warnings[0] and "days" in trace.warnings[0]
    res = CliRunner().invoke(trace_cli, ["stats", str(path)])
    assert res.exit_code == 0 and "time unit looks wrong" in res.output


def test_span_over_30_days_warns_and_think_time_too(tmp_path):
    day = 86_400.0
    rows = [{"arrival_s": 0.0, "session": 1, "output_tokens": 1, "segments": [[1, 4]]},
            {"arrival_s": 31 * day, "session": 2, "output_tokens": 1, "segments": [[1, 4]]},
            {"arrival_s": 31 * day, "session": 1, "think_time_s": 40 * day, "output_tokens": 1,
             "segments": [[1, 4]]}]  # fmt: skip
    path = tmp_path / "k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    warnings = load_trace(path).warnings
    assert len(warnings) == 2 and all("time unit looks wrong" in w for w in warnings)
    assert load_trace(path, max_requests=1).warnings == ()  # what is simulated is what counts


@pytest.mark.parametrize("name", ["mooncake-conversation", "azure-conv", "sharegpt", "agentic"])
def test_real_traces_do_not_warn(name):
    assert load_trace(name).warnings == ()


def test_warnings_survive_every_trace_construction():
    table = load_trace("mooncake-arxiv-1000", max_requests=3).table
    index = table.schema.get_field_index("arrival_s")
    far = table.set_column(index, table.schema.field(index), pa.array([0.0, 1.0, 40 * 86_400.0]))
    assert Trace.from_table(far).warnings


# --- item 10: a chat file with prompts and no replies -----------------------------------------


def test_first_turn_only_sharegpt_says_why_there_are_no_requests():
    path = traces_dir() / "sharegpt" / "ShareGPT_V3_filtered_500.json"
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, "no requests", "none of the 500 conversations", "assistant reply",
             "first-turn", "'sharegpt'")  # fmt: skip


def test_prompts_only_lmsys_says_why(tmp_path):
    item = pa.struct([("content", pa.string()), ("role", pa.string())])
    convs = [[{"content": "hi", "role": "user"}], [{"content": "yo", "role": "assistant"}]]
    path = tmp_path / "l.parquet"
    pq.write_table(pa.table({"conversation_id": ["a", "b"],
                             "conversation": pa.array(convs, pa.list_(item))}), path)  # fmt: skip
    with pytest.raises(TraceError) as info:
        load_trace(path)
    one_line(info, "none of the 2 conversations", "assistant reply")


def test_all_rows_skipped_says_so(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0}\n')
    with pytest.raises(TraceError) as info:
        load_trace(path, skip_bad_rows=True)
    one_line(info, "no requests", "malformed")

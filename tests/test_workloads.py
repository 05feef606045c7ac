"""Loaders for every source format, the generators, and `kvsim trace` (issue 3)."""

from __future__ import annotations

import gzip
import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kvsim.errors import KvsimError, TraceError
from kvsim.traces import read_trace, segment_columns, traces_dir, validate_trace
from kvsim.traces.agentic import AgenticParams, generate_agentic
from kvsim.traces.cli import trace as trace_cli
from kvsim.traces.lmsys import LmsysParams, generate_lmsys, write_lmsys_parquet
from kvsim.traces.registry import detect_format, load_trace, trace_names
from kvsim.traces.stats import reuse_ceiling, trace_stats

BUILT_INS = [
    "agentic", "azure-code", "azure-conv", "lmsys", "mooncake-arxiv-1000",
    "mooncake-conversation", "mooncake-synthetic", "mooncake-toolagent", "pi-coding-agent",
    "sharegpt",
]  # fmt: skip


def col(trace, name):
    return trace.table.column(name).to_numpy(zero_copy_only=False)


def run_cli(*args):
    return CliRunner().invoke(trace_cli, list(args), catch_exceptions=True)


# --- registry ---------------------------------------------------------------------------------


def test_every_built_in_is_listed_and_canonical():
    assert trace_names() == BUILT_INS
    for name in BUILT_INS:
        tr = load_trace(name, max_requests=300)
        validate_trace(tr.table, name)
        assert tr.name == name and tr.description and len(tr) == min(300, len(tr))
    out = run_cli("list")
    assert out.exit_code == 0
    assert [line.split()[0] for line in out.output.splitlines()] == BUILT_INS


# --- real samples reproduce their published or counted figures ---------------------------------


@pytest.mark.parametrize(
    ("name", "rows", "in_mean", "out_mean", "span_s"),
    [("azure-code", 8_819, 2_048, 27.9, 3_436), ("azure-conv", 19_366, 1_155, 211.1, 3_502)],
)
def test_azure_matches_provenance(name, rows, in_mean, out_mean, span_s):
    tr = load_trace(name)
    assert len(tr) == rows
    assert round(col(tr, "input_tokens").mean()) == in_mean
    assert round(col(tr, "output_tokens").mean(), 1) == out_mean
    assert abs(col(tr, "arrival_s").max() - span_s) < 1.0
    assert (col(tr, "output_hash") == 0).all()
    assert reuse_ceiling(tr, 16)[0] == 0.0  # no prefix data: no reuse assumed


def test_pi_trace_counts_reuse_and_think_times():
    tr = load_trace("pi-coding-agent")
    assert len(tr) == 17 and tr.native_block_size == 16
    inputs = col(tr, "input_tokens")
    assert round(inputs.mean()) == 3_913 and np.median(inputs) == 3_423
    assert round(col(tr, "output_tokens").mean()) == 476
    assert np.unique(col(tr, "session_id")).size == 5  # manual probe, root, 3 subagents
    token_ratio, block_ratio = reuse_ceiling(tr, 16)
    assert round(block_ratio, 3) == 0.716  # PROVENANCE: infinite cache from the hashes
    assert round(token_ratio, 3) == 0.717
    think = col(tr, "think_time_s")
    turn = col(tr, "turn")
    assert np.isnan(think[turn == 0]).all() and (think[turn > 0] >= 0).all()
    # The root waited 71.84 s for its subagent tool (duration_ms 71,836.5 in the trace).
    assert np.nanmax(think) == pytest.approx(71.843, abs=0.01)
    assert "subagent <- parent" in tr.description


def test_swe_agent_trajectories_match_model_stats():
    root = traces_dir() / "swe-agent"
    expected = {"gpt4_pydicom__pydicom-1458": (12, 122_612), "gpt4_swe-agent__test-repo-i1":
                (5, 52_861), "demo_function_calling_marshmallow-1867": (13, None)}  # fmt: skip
    for stem, (calls, sent) in expected.items():
        tr = load_trace(root / f"{stem}.traj")
        assert len(tr) == calls
        if sent is not None:  # GPT-4 tokenizer counts vs our bytes/4: within 5%
            assert col(tr, "input_tokens").sum() == pytest.approx(sent, rel=0.05)
        rows = tr.table.to_pylist()
        for prev, row in itertools.pairwise(rows):
            reply = {"hash": prev["output_hash"], "tokens": prev["output_tokens"],
                     "kind": "assistant"}  # fmt: skip
            assert row["segments"][: len(prev["segments"]) + 1] == [*prev["segments"], reply]
    demo = load_trace(root / "demo_function_calling_marshmallow-1867.traj")
    assert col(demo, "think_time_s")[1] == pytest.approx(0.116, abs=1e-3)
    assert len(load_trace(root)) == 30


SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "system", "value": "You are a helpful assistant."},
        {"from": "human", "value": "Hello there, how are you today?"},
        {"from": "gpt", "value": "I am fine, thank you for asking."},
        {"from": "human", "value": "Tell me a joke."},
        {"from": "gpt", "value": "Why did the chicken cross the road?"}]},
    {"id": "b", "conversations": [
        {"from": "system", "value": "You are a helpful assistant."},
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "unanswered"}]},
]  # fmt: skip


def test_sharegpt_json_history_and_shared_system_prompt(tmp_path):
    path = tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json"
    path.write_text(json.dumps(SHAREGPT, indent=1))
    tr = load_trace(path, seed=3)
    validate_trace(tr.table, "sg")
    assert detect_format(path) == "sharegpt" and len(tr) == 3
    rows = sorted(tr.table.to_pylist(), key=lambda r: (r["session_id"], r["turn"]))
    a0, a1, b0 = rows
    assert [s["kind"] for s in a0["segments"]] == ["system", "user"]
    assert [s["kind"] for s in a1["segments"]] == ["system", "user", "assistant", "user"]
    assert a1["segments"][2] == {"hash": a0["output_hash"], "tokens": a0["output_tokens"],
                                 "kind": "assistant"}  # fmt: skip
    assert a0["segments"][0] == b0["segments"][0]  # same system text, same hash
    assert a0["output_tokens"] == math.ceil(len("I am fine, thank you for asking.") / 4)
    assert a1["think_time_s"] > 0 and a0["think_time_s"] is None
    assert load_trace(path, seed=3).table.equals(tr.table)


def test_sharegpt_bad_role_names_line_and_field(tmp_path):
    data = [SHAREGPT[0], {"id": "x", "conversations": [{"from": "robot", "value": "?"}]}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data, indent=1))
    with pytest.raises(TraceError, match=r"s\.json:\d+: field 'from': unknown role 'robot'"):
        load_trace(path)
    tr = load_trace(path, skip_bad_rows=True)
    assert tr.skipped_rows == 1 and len(tr) == 2


def test_lmsys_parquet_streams_in_batches(tmp_path):
    path = tmp_path / "lmsys.parquet"
    write_lmsys_parquet(path, 3_000, seed=5, batch=1_000)
    assert detect_format(path) == "lmsys"
    tr = load_trace(path)
    validate_trace(tr.table, "lmsys")
    # One request per assistant message; lengths read back as drawn (tag rounding only).
    table = pq.read_table(path)
    replies = sum(1 for c in table.column("conversation").to_pylist() for m in c
                  if m["role"] == "assistant")  # fmt: skip
    assert len(tr) == replies
    assert np.unique(col(tr, "session_id")).size == 3_000
    head = load_trace(path, max_requests=100)
    assert head.table.equals(tr.table.slice(0, 100))


def test_lmsys_bad_role(tmp_path):
    item = pa.struct([("content", pa.string()), ("role", pa.string())])
    msgs = [{"content": "hi", "role": "user"}, {"content": "yo", "role": "robot"}]
    conv = pa.array([msgs], pa.list_(item))
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"conversation_id": ["x"], "conversation": conv}), path)
    with pytest.raises(TraceError, match=r"bad\.parquet: row 0: field 'conversation.role'"):
        load_trace(path)


BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def test_burstgpt_fixture_and_sessions(tmp_path):
    path = tmp_path / "BurstGPT_3.csv"
    path.write_text(
        BURST_HEADER + ",Session ID\n"
        "5,ChatGPT,472,18,490,Conversation log,s1\n"
        "45,ChatGPT,1087,0,1087,Conversation log,s2\n"
        "60,ChatGPT,600,20,620,Conversation log,s1\n"
        "118,GPT-4,417,276,693,API log,\n"
    )
    tr = load_trace(path)
    validate_trace(tr.table, "burst")
    assert len(tr) == 4 and np.unique(col(tr, "session_id")).size == 3
    assert col(tr, "turn").tolist() == [0, 0, 1, 0]
    assert col(tr, "output_tokens").tolist() == [18, 1, 20, 276]
    assert "1 failed requests" in tr.description
    assert col(tr, "arrival_s").tolist() == [0, 40, 55, 113]


@pytest.mark.parametrize(
    ("row", "line", "field", "fragment"),
    [
        ("7,ChatGPT,,5,5,Conversation log", 3, "Request tokens", "missing"),
        ("7,ChatGPT,-4,5,1,Conversation log", 3, "Request tokens", "non-negative integer"),
        ("soon,ChatGPT,4,5,9,Conversation log", 3, "Timestamp", "got 'soon'"),
    ],
)
def test_burstgpt_bad_rows(tmp_path, row, line, field, fragment):
    path = tmp_path / "b.csv"
    path.write_text(f"{BURST_HEADER}\n1,ChatGPT,4,5,9,Conversation log\n{row}\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value).startswith(f"{path}:{line}: field '{field}'")
    assert fragment in str(info.value)
    assert load_trace(path, skip_bad_rows=True).skipped_rows == 1


def test_azure_2024_layout_and_bad_rows(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_conv_1week.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,1000,20\n"
        "2024-05-10 00:00:01+00:00,200,5\n"
    )
    tr = load_trace(path)
    assert col(tr, "arrival_s") == pytest.approx([0.0, 0.99007])
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,12\n")
    with pytest.raises(TraceError, match=r"bad\.csv:2: expected 3 fields"):
        load_trace(bad)


def _pi_lines():
    with gzip.open(traces_dir() / "dynamo" / "pi_request_trace.jsonl.gz", "rt") as handle:
        return handle.read().splitlines()


def test_dynamo_hash_count_mismatch_and_skip(tmp_path):
    lines = _pi_lines()
    rec = json.loads(lines[1])
    rec["event"]["request"]["replay"]["input_sequence_hashes"].pop()
    lines[1] = json.dumps(rec)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert detect_format(path) == "dynamo"
    with pytest.raises(TraceError, match=r"t\.jsonl:2: field 'replay.input_sequence_hashes'"):
        load_trace(path)
    tr = load_trace(path, skip_bad_rows=True)
    assert len(tr) == 16 and tr.skipped_rows == 1


# --- generators ---------------------------------------------------------------------------------


def _clipped_lognormal_mean(mean, std, hi):
    """E[min(X, hi)] for the moment-matched lognormal (an independent, closed-form target)."""
    s2 = math.log1p((std / mean) ** 2)
    mu, s = math.log(mean) - s2 / 2, math.sqrt(s2)
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    z = (math.log(hi) - mu) / s
    return mean * phi(z - s) + hi * (1 - phi(z))


def test_lmsys_generator_matches_targets():
    p = LmsysParams(sessions=100_000)
    tr = generate_lmsys(p, seed=11)
    sessions = np.unique(col(tr, "session_id")).size
    assert len(tr) / sessions == pytest.approx(2.02, rel=0.02)
    out = col(tr, "output_tokens")
    target = _clipped_lognormal_mean(p.reply_mean_tokens, p.reply_std_tokens, p.reply_max_tokens)
    assert out.mean() == pytest.approx(target, rel=0.05)
    assert np.median(out) == pytest.approx(25, abs=2)
    seg = segment_columns(tr.table)
    user = seg.tokens[seg.offsets[1:] - 1]
    assert user.mean() == pytest.approx(69.83, rel=0.03)
    assert user.std() == pytest.approx(143.49, rel=0.15)
    assert generate_lmsys(LmsysParams(sessions=200), seed=2).table.equals(
        generate_lmsys(LmsysParams(sessions=200), seed=2).table
    )


def test_agentic_structure():
    tr = generate_agentic(AgenticParams(sessions=300), seed=4)
    validate_trace(tr.table, "agentic")
    rows = tr.table.to_pylist()
    firsts = [r["segments"][0] for r in rows]
    assert {(s["tokens"], s["kind"]) for s in firsts} == {(4000, "system")}
    assert len({s["hash"] for s in firsts}) == 1
    by_session = {}
    for r in rows:
        by_session.setdefault(r["session_id"], []).append(r)
    subagents = [s for s, rs in by_session.items() if len(rs[0]["segments"]) == 3]
    assert subagents  # some sessions spawned subagents sharing the root's prefix
    for s in subagents[:20]:
        first = by_session[s][0]
        roots = [rs[0] for rs in by_session.values() if len(rs[0]["segments"]) == 2
                 and rs[0]["segments"][1] == first["segments"][1]]  # fmt: skip
        assert len(roots) == 1 and first["arrival_s"] > roots[0]["arrival_s"]
    assert trace_stats(tr)["reuse_ceiling"] > 0.8
    assert tr.table.equals(generate_agentic(AgenticParams(sessions=300), seed=4).table)


# --- CLI: stats, convert, synth -----------------------------------------------------------------


def test_stats_json_and_plot(tmp_path):
    out = run_cli("stats", "pi-coding-agent", "--json", "--plot", str(tmp_path / "png"))
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output)
    assert figures["requests"] == 17 and figures["sessions"] == 5
    assert figures["block_size"] == 16 and round(figures["reuse_ceiling"], 3) == 0.717
    assert {"input_tokens_mean", "output_tokens_mean"} <= figures.keys()
    assert (tmp_path / "png" / "input_tokens.png").stat().st_size > 1000
    text = run_cli("stats", "azure-code", "--block-size", "32")
    assert "reuse ceiling (infinite cache, block 32)" in text.output


@pytest.mark.parametrize(
    "make",
    ["lmsys", "sharegpt-json", "azure", "dynamo", "mooncake"],
)
def test_convert_then_reload_loses_nothing(tmp_path, make):
    if make == "lmsys":
        src = tmp_path / "l.parquet"
        write_lmsys_parquet(src, 2_500, seed=1, batch=500)
    elif make == "sharegpt-json":
        src = tmp_path / "s.json"
        src.write_text(json.dumps(SHAREGPT * 50))
    elif make == "azure":
        src = traces_dir() / "azure" / "AzureLLMInferenceTrace_code.csv"
    elif make == "dynamo":
        src = traces_dir() / "dynamo" / "pi_request_trace.jsonl.gz"
    else:
        src = traces_dir() / "mooncake" / "mooncake_trace_1000.jsonl"
    out = tmp_path / "out.parquet"
    res = run_cli("convert", str(src), "-o", str(out))
    assert res.exit_code == 0, res.output
    back = read_trace(out)
    direct = load_trace(src)
    assert back.table.equals(direct.table)
    assert back.table.schema.metadata == direct.table.schema.metadata


def test_synth_is_deterministic(tmp_path):
    for kind in ("lmsys", "agentic", "sharegpt"):
        a, b = tmp_path / f"{kind}a.parquet", tmp_path / f"{kind}b.parquet"
        assert (
            run_cli("synth", kind, "--requests", "500", "--seed", "9", "-o", str(a)).exit_code == 0
        )
        run_cli("synth", kind, "--requests", "500", "--seed", "9", "-o", str(b))
        assert a.read_bytes() == b.read_bytes()
        assert len(read_trace(a)) == 500


def test_cli_errors_are_kvsim_errors(tmp_path):
    bad = tmp_path / "b.csv"
    bad.write_text(f"{BURST_HEADER}\n1,ChatGPT,-1,5,9,Conversation log\n")
    res = run_cli("stats", str(bad))
    assert isinstance(res.exception, KvsimError)
    assert str(res.exception).startswith(f"{bad}:2: field 'Request tokens'")
    res = run_cli("stats", str(bad), "--skip-bad-rows")
    assert res.exit_code != 0  # every row was bad: nothing to report, still one error
    assert isinstance(res.exception, KvsimError)
    out = run_cli("convert", str(traces_dir() / "azure" / "AzureLLMInferenceTrace_code.csv"),
                  "--format", "nope", "-o", str(tmp_path / "x.parquet"))  # fmt: skip
    assert isinstance(out.exception, KvsimError) and "valid:" in str(out.exception)


def test_real_tokenizer_counts_tokens(tmp_path):
    """A tokenizer.json built here (word level, whitespace split) gives exact word counts."""
    tokenizers = pytest.importorskip("tokenizers", reason="pip install 'kvsim[tokenizers]'")
    vocab = {"[UNK]": 0}
    for conv in SHAREGPT:
        for turn in conv["conversations"]:
            for word in turn["value"].split():
                vocab.setdefault(word, len(vocab))
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    exact = load_trace(path, seed=3, tokenizer=str(tok_path))
    approx = load_trace(path, seed=3)
    first = min(exact.table.to_pylist(), key=lambda r: (r["session_id"], r["turn"]))
    assert first["output_tokens"] == len(["I", "am", "fine,", "thank", "you", "for", "asking."])
    assert not exact.table.column("input_tokens").equals(approx.table.column("input_tokens"))
    with pytest.raises(KvsimError, match="tokenizer"):
        load_trace(path, tokenizer=str(tmp_path / "missing.json"))

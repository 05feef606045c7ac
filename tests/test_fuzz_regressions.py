"""Issue 10, fuzzing: each crasher `benchmarks/fuzz_inputs.py` found (and the inputs of the same
class found while fixing them), as the smallest file that reproduced it. Every one must now be a
one-line KvsimError naming the file, or load correctly; before the fix each escaped as another
exception (RecursionError, TypeError, KeyError, OverflowError, OSError, pyarrow errors) or printed
a traceback. The runs, inputs tried and crashers found are in docs/fuzzing.md."""

from __future__ import annotations

import dataclasses
import io
import json
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from inputs import one_line

from kvsim.capacity import profile_capacity_report
from kvsim.errors import ConfigError, KvsimError, TraceError
from kvsim.hardware import load_profile, profiles_dir, validate_profile
from kvsim.models import load_model, tp_degrees
from kvsim.run import RunConfig
from kvsim.traces import load_trace, read_trace, traces_dir, write_trace
from kvsim.traces.convert import convert_to_parquet
from kvsim.traces.registry import open_source
from kvsim.traces.schema import validate_trace
from kvsim.traces.sharegpt import load_sharegpt

DEEP_JSON = "[" * 100_000  # json.loads raises RecursionError, not ValueError
DEEP_TOML = "a = " + "[" * 100_000  # tomllib too
LONG_INT = "7" * 5000  # past int()'s 4300-digit limit: ValueError from json and tomllib
H100_TEXT = (profiles_dir() / "h100-sxm.toml").read_text()
MODEL_TEXT = (resources.files("kvsim") / "catalog" / "llama-3.2-1b.toml").read_text()
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
JSONL_ROW = '{"arrival_s": 0.0, "output_tokens": 5, "segments": [[1, 40, "user"]]}\n'
DYNAMO_ROW = json.dumps({
    "timestamp": 1000,
    "event": {"event_type": "request_end", "agent_context": {"session_id": "a"},
              "request": {"input_tokens": 20, "output_tokens": 4,
                          "replay": {"trace_block_size": 16, "input_sequence_hashes": [1, 2]}}},
}) + "\n"  # fmt: skip
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,40,5\n"


@pytest.fixture(autouse=True)
def _shipped_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSIM_PROFILES", raising=False)
    monkeypatch.delenv("KVSIM_TRACES", raising=False)


def _fails(exc_type: type[KvsimError], call, *fragments: str) -> str:
    with pytest.raises(exc_type) as info:
        call()
    return one_line(info, *fragments)


# --- JSON nested deeper than the parser recurses; integers past 4300 digits ----------------------


@pytest.mark.parametrize(
    ("name", "good_row"),
    [("m.jsonl", MOONCAKE_ROW), ("k.jsonl", JSONL_ROW), ("d.jsonl", DYNAMO_ROW)],
    ids=["mooncake", "jsonl", "dynamo"],
)
def test_deeply_nested_json_line_is_a_bad_row(tmp_path: Path, name: str, good_row: str) -> None:
    """A JSONL line of 100,000 '[' was a RecursionError (found in format detection too)."""
    path = tmp_path / name
    path.write_text(good_row + DEEP_JSON + "\n")
    _fails(TraceError, lambda: load_trace(path), f"{name}:2", "nested too deeply")
    assert load_trace(path, skip_bad_rows=True).skipped_rows == 1
    path.write_text(DEEP_JSON + "\n" + good_row)  # on the first line, the one detection reads
    _fails(TraceError, lambda: load_trace(path), f"{name}:1")


@pytest.mark.parametrize(
    ("name", "text"),
    [("s.json", "[" + DEEP_JSON), ("s.json", f"[{{\"n\": {LONG_INT}}}]"),
     ("t.traj", DEEP_JSON)],
    ids=["sharegpt-deep", "sharegpt-digits", "swe-agent-deep"],
)  # fmt: skip
def test_deep_or_long_json_document_is_one_line(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    _fails(TraceError, lambda: load_trace(path), name, "not valid JSON")


def test_sharegpt_first_turn_sample_reader(tmp_path: Path) -> None:
    """The built-in `sharegpt` trace's reader: `conversations` a number was a TypeError."""
    path = tmp_path / "s.json"
    path.write_text('[{"id": "x", "conversations": 1.5}]')
    _fails(TraceError, lambda: load_sharegpt(path), "s.json", "item 0")
    path.write_text(DEEP_JSON)
    _fails(TraceError, lambda: load_sharegpt(path), "s.json", "not valid JSON")


def test_sharegpt_role_of_the_wrong_type_is_a_bad_row(tmp_path: Path) -> None:
    """`"from": [...]` was a TypeError (unhashable list) in the role lookup."""
    path = tmp_path / "s.json"
    bad = {"id": "b", "conversations": [{"from": ["human"], "value": "hi"}]}
    good = {"id": "g", "conversations": [{"from": "human", "value": "hi"},
                                         {"from": "gpt", "value": "hello"}]}  # fmt: skip
    path.write_text(json.dumps([good, bad]))
    _fails(TraceError, lambda: load_trace(path), "s.json:1", "unknown role")
    assert load_trace(path, skip_bad_rows=True).skipped_rows == 1


@pytest.mark.parametrize("kind", ["profile", "model", "config"])
@pytest.mark.parametrize("text", [DEEP_TOML, f"a = {LONG_INT}"], ids=["deep", "digits"])
def test_deep_or_long_toml_is_one_line(tmp_path: Path, kind: str, text: str) -> None:
    """RecursionError (nesting) and ValueError (digits) escaped tomllib in all three readers."""
    path = tmp_path / "bad.toml"
    path.write_text(text)
    read = {"profile": validate_profile, "model": lambda p: load_model(str(p)),
            "config": RunConfig.from_toml}[kind]  # fmt: skip
    _fails(ConfigError, lambda: read(path), "bad.toml", "TOML")


# --- CSV ----------------------------------------------------------------------------------------


def test_csv_header_naming_a_column_twice(tmp_path: Path) -> None:
    """A duplicated header name was a KeyError from the column lookup."""
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,40,5,5\n")  # fmt: skip
    _fails(TraceError, lambda: load_trace(path), "a.csv:1", "'GeneratedTokens'", "2 times")


def test_csv_field_over_the_csv_modules_limit(tmp_path: Path) -> None:
    """A row with too few fields, one of them over 128 KiB: csv.Error while naming the line."""
    path = tmp_path / "a.csv"
    path.write_text(AZURE + "2023-11-16 18:15:47.6805900," + "9" * 200_000 + "\n")
    _fails(TraceError, lambda: load_trace(path), "a.csv:3")


def test_csv_short_row_that_is_not_utf8(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """pyarrow's bad-row callback cannot decode such a row: it printed a traceback ("Exception
    ignored in ...") and the error quoted the raw bytes instead of saying what is wrong."""
    path = tmp_path / "a.csv"
    path.write_bytes(AZURE.encode() + b"2023-11-16 18:15:47.6805900,1\xf3\n")
    _fails(TraceError, lambda: load_trace(path), "a.csv:3", "not UTF-8")
    assert "Traceback" not in capfd.readouterr().err


def test_servegen_field_over_the_csv_modules_limit(tmp_path: Path) -> None:
    (tmp_path / "servegen" / "g").mkdir(parents=True)
    (tmp_path / "servegen" / "g" / "c-trace.csv").write_text("0," + "1" * 200_000 + ",1,,0,0\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text(JSONL_ROW)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVSIM_TRACES", str(tmp_path))
        _fails(TraceError, lambda: load_trace(trace, arrival="servegen:g/c", rate=1.0),
               "c-trace.csv:1", "CSV")  # fmt: skip


# --- kvsim JSONL ----------------------------------------------------------------------------------


def test_jsonl_turn_too_large_for_int64(tmp_path: Path) -> None:
    """`"turn": 10**20` passed the row check and overflowed numpy's int64."""
    path = tmp_path / "k.jsonl"
    path.write_text(JSONL_ROW + JSONL_ROW.replace('"arrival_s"', f'"turn": {10**20}, "arrival_s"'))
    _fails(TraceError, lambda: load_trace(path), "k.jsonl:2", "'turn'")


def test_jsonl_largest_session_id_and_rows_without_one(tmp_path: Path) -> None:
    """Rows without a session were numbered after the largest id: 2^63 - 1 + 1 overflowed."""
    path = tmp_path / "k.jsonl"
    top = JSONL_ROW.replace('"arrival_s"', f'"session": {2**63 - 1}, "arrival_s"')
    path.write_text(top + JSONL_ROW)
    sessions = load_trace(path).table.column("session_id").to_pylist()
    assert sorted(sessions) == [0, 2**63 - 1]


# --- LMSYS and canonical Parquet ----------------------------------------------------------------


def _lmsys_table(question: str, reply: str) -> pa.Table:
    conversation = [{"content": question, "role": "user"}, {"content": reply, "role": "assistant"}]
    return pa.Table.from_pylist([{"conversation_id": "c", "conversation": conversation}])


def test_lmsys_damaged_pages_are_one_line(tmp_path: Path) -> None:
    """Cut or overwritten data pages: OSError, ArrowInvalid ("Output buffer size"), or a
    multi-line "cannot write" blamed on the output by `trace convert`. Every damage of the data
    pages now loads or is one TraceError line naming the file."""
    buf = io.BytesIO()
    pq.write_table(_lmsys_table("hello " * 50, "there " * 50), buf, compression="none")
    good = buf.getvalue()
    refused = 0
    path = tmp_path / "l.parquet"
    for start in range(4, 400, 7):
        path.write_bytes(good[:start] + b"\xff" * 9 + good[start + 9 :])
        for read in (lambda: load_trace(path, format="lmsys"),
                     lambda: convert_to_parquet(open_source(path, format="lmsys"),
                                                tmp_path / "out.parquet")):  # fmt: skip
            try:
                read()
            except TraceError as exc:
                assert "\n" not in str(exc) and "l.parquet" in str(exc), str(exc)
                refused += 1
    assert refused > 0


def test_lmsys_text_that_is_not_utf8(tmp_path: Path) -> None:
    """Invalid UTF-8 inside a Parquet string page was an ArrowException from the hashing."""
    buf = io.BytesIO()
    pq.write_table(_lmsys_table("hello there", "general kenobi"), buf, compression="none",
                   use_dictionary=False)  # fmt: skip
    path = tmp_path / "l.parquet"
    path.write_bytes(buf.getvalue().replace(b"hello there", b"\xff\xfello there"))
    _fails(TraceError, lambda: load_trace(path, format="lmsys"), "l.parquet", "Parquet")


def test_lmsys_column_name_that_is_not_utf8(tmp_path: Path) -> None:
    """A column name with bad UTF-8 was a UnicodeDecodeError from pyarrow's ParquetFile."""
    buf = io.BytesIO()
    table = _lmsys_table("hi", "ho").append_column("zzzzz", pa.array([1]))
    pq.write_table(table, buf, store_schema=False)
    path = tmp_path / "l.parquet"
    path.write_bytes(buf.getvalue().replace(b"zzzzz", b"z\xffzzz"))
    for fmt in ("lmsys", None):  # read, and format detection
        _fails(TraceError, lambda fmt=fmt: load_trace(path, format=fmt), "l.parquet")


def test_lmsys_content_that_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "l.parquet"
    message = pa.struct([("content", pa.int64()), ("role", pa.string())])
    pq.write_table(pa.table({"conversation_id": ["c"],
                             "conversation": pa.array([[{"content": 5, "role": "user"}]],
                                                      pa.list_(message))}), path)  # fmt: skip
    _fails(TraceError, lambda: load_trace(path, format="lmsys"), "l.parquet", "conversation")


@pytest.fixture()
def canonical() -> pa.Table:
    return load_trace("mooncake-arxiv-1000", max_requests=5).table


def test_canonical_columns_in_another_order_or_with_extras(tmp_path, canonical) -> None:
    """A tool writing the canonical columns in another order (or adding one) passed validation
    and then failed the final cast with a ValueError; they are read as the canonical table."""
    path = tmp_path / "c.parquet"
    names = canonical.column_names
    pq.write_table(canonical.select(names[::-1]).append_column("note", pa.array(["x"] * 5)), path)
    assert read_trace(path).table.equals(canonical)


def test_canonical_column_twice(canonical) -> None:
    """In a table handed to `validate_trace` (a Parquet file with it is refused by pyarrow)."""
    table = canonical.append_column("turn", canonical.column("turn"))
    _fails(TraceError, lambda: validate_trace(table, "mine"), "mine", "'turn'", "2 times")


def test_canonical_without_rows_is_refused(tmp_path, canonical) -> None:
    """Every other loader refuses a source without requests; an empty canonical file ran a
    simulation of nothing and exited 0."""
    path = tmp_path / "c.parquet"
    write_trace(canonical.slice(0, 0), path)
    _fails(TraceError, lambda: load_trace(path), "c.parquet", "no requests")


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [(b"kvsim.skipped_rows", b"abc", "kvsim.skipped_rows"),
     (b"kvsim.native_block_size", b"-1", "kvsim.native_block_size"),
     (b"kvsim.trace_name", b"\xff\xfe", "kvsim.trace_name"),
     (b"kvsim.description", b"\xc3", "kvsim.description")],
)  # fmt: skip
def test_canonical_metadata_written_by_another_tool(tmp_path, canonical, key, value, fragment):
    """A bad `kvsim.skipped_rows` was a ValueError, non-UTF-8 names a UnicodeDecodeError."""
    meta = {**canonical.schema.metadata, key: value}
    path = tmp_path / "c.parquet"
    pq.write_table(canonical.replace_schema_metadata(meta), path)
    for skip in (False, True):
        _fails(TraceError, lambda skip=skip: load_trace(path, skip_bad_rows=skip), fragment)


def test_canonical_segment_kind_that_is_not_utf8(tmp_path, canonical) -> None:
    buf = io.BytesIO()
    pq.write_table(canonical, buf, compression="none", use_dictionary=False)
    path = tmp_path / "c.parquet"
    path.write_bytes(buf.getvalue().replace(b"opaque", b"\xffpaque"))
    _fails(TraceError, lambda: read_trace(path), "c.parquet", "Parquet")


# --- names no system can look up --------------------------------------------------------------


def test_names_longer_than_the_file_name_limit() -> None:
    """A name over 255 bytes made `Path.exists` raise OSError (ENAMETOOLONG) in every reader."""
    name = "x" * 300
    _fails(ConfigError, lambda: load_model(name + ".toml"), "not found")
    _fails(ConfigError, lambda: load_profile(name + ".toml"), "no such profile file")
    _fails(TraceError, lambda: load_trace(name + ".jsonl"), "no such trace file")
    _fails(KvsimError, lambda: load_trace(traces_dir() / "x" / (name + ".csv")))


# --- hardware profiles -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [("gpus_per_node = 8", f"gpus_per_node = {10**400}", "gpus_per_node"),
     ("gpus_per_node = 8", "gpus_per_node = 10000000", "gpus_per_node"),
     ("gpu_usd_per_hour = 6.16", f"gpu_usd_per_hour = {10**400}", "gpu_usd_per_hour"),
     ("[efficiency]\n", f"[efficiency]\niteration_overhead_s = {10**400}\n",
      "iteration_overhead_s")],
)  # fmt: skip
def test_profile_integer_too_long_for_a_float(tmp_path: Path, old: str, new: str, field: str):
    """10**400 GPUs per node was an OverflowError in the bandwidth arithmetic; 10**400 as a
    price an OverflowError from math.isfinite."""
    path = tmp_path / "bad.toml"
    assert old in H100_TEXT
    path.write_text(H100_TEXT.replace(old, new, 1))
    _fails(ConfigError, lambda: validate_profile(path), "bad.toml", field)


def test_profile_key_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('"odd\\nkey" = 1\n' + H100_TEXT)
    _fails(ConfigError, lambda: validate_profile(path), "bad.toml", "'odd\\nkey'")


def test_measured_table_integer_too_long_for_a_float(tmp_path: Path) -> None:
    """Calibration tables: `overhead_s = 10**400` was an OverflowError from math.isfinite."""
    meta = "".join(f'{k} = "cpu"\n' for k in ("device", "device_kind", "driver", "torch", "date",
                                               "model", "dtype", "kv_dtype"))  # fmt: skip
    path = tmp_path / "bad.toml"
    path.write_text(H100_TEXT + f"\n[measured]\n{meta}tp = 1\noverhead_s = {10**400}\n")
    _fails(ConfigError, lambda: validate_profile(path), "bad.toml", "measured.overhead_s")


# --- models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_layers"])
def test_model_integer_too_large(tmp_path: Path, field: str) -> None:
    """Counts no model has (10**400) passed the reader and overflowed float sizing later."""
    text = "\n".join(f"{field} = {10**400}" if line.startswith(f"{field} =") else line
                     for line in MODEL_TEXT.splitlines())  # fmt: skip
    path = tmp_path / "m.toml"
    path.write_text(text)
    _fails(ConfigError, lambda: load_model(str(path)), "m.toml", field, "at most")


def test_model_with_very_many_heads_sizes_at_once(tmp_path: Path) -> None:
    """`kvsim size` on a model claiming 100,000,001 attention heads (it does not fit, so the
    report looks for the smallest tp that would) tried every tp from 1 to the head count: the
    fuzzer's 10 s limit stopped it. Only divisors of the head counts are candidates now."""
    text = MODEL_TEXT.replace("num_attention_heads = 32", "num_attention_heads = 2147483647")
    text = text.replace("num_heads = 32", "num_heads = 2147483647").replace(
        "num_kv_heads = 8", "num_kv_heads = 1"
    )
    path = tmp_path / "m.toml"
    path.write_text(text)
    spec = load_model(str(path))
    assert tp_degrees(spec) == [1, 2**31 - 1]  # a prime: itself and 1
    report = profile_capacity_report(spec, load_profile("h100-sxm"), tp=1, kv_dtype="bf16",
                                     weight_dtype="bf16", context_tokens=4096, block_size=16,
                                     strict=False)  # fmt: skip
    assert not report["fits"]


def test_model_key_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('"odd\\nkey" = 1\n' + MODEL_TEXT)
    _fails(ConfigError, lambda: load_model(str(path)), "m.toml", "'odd\\nkey'")


# --- run configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("trace = 5", "trace: expected a [trace] table"),
     ("hardware = [1]", "hardware: expected a [hardware] table"),
     ("[trace]\nmax_requests = \"5\"", "trace.max_requests: expected an integer"),
     (f"[trace]\nmax_requests = {2**64}", "trace.max_requests: expected an integer"),
     ("[trace]\nrate = nan", "trace.rate: expected a finite number"),
     ("[trace]\nname = 1979-05-27", "trace.name: expected a string"),
     ("[trace]\nnmae = \"x\"", "trace.nmae: unknown key"),
     ("[model]\nname = 1.5", "model.name: expected a string"),
     ("[hardware]\nprofile = \"a\\u0000b\"", "hardware.profile: expected a string"),
     ("[slo]\nttft_s = \"1s\"", "slo.ttft_s: expected a finite number"),
     ("[engine]\npolicy_params = 3", "engine.policy_params: expected a string"),
     ("[engine]\npd = 5", "engine.pd: expected a string"),
     ("[engine]\nprefetch = 1", "engine.prefetch: expected true or false"),
     ('["odd\\nkey"]', "unknown table ['odd\\nkey']")],
)  # fmt: skip
def test_config_values_of_the_wrong_type(tmp_path: Path, text: str, fragment: str) -> None:
    """The reader took each (or failed with AttributeError on a non-table): then `kvsim run`
    failed with an AttributeError or TypeError (`str < int`, `int.partition`, `float` as a
    path), or could not write the resolved config back (a date); a NaN rate passed; a key with
    a newline split the error over two lines; unknown keys outside [engine] were ignored."""
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    _fails(ConfigError, lambda: RunConfig.from_toml(path), "c.toml", fragment)


def test_config_numbers_are_read_as_their_fields_types(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[trace]\nname = "lmsys"\nrate = 2\nmax_requests = 7\n[engine]\ntp = 2\n')
    config = RunConfig.from_toml(path)
    got = (config.trace, config.rate, config.max_requests, config.engine.tp)
    assert got == ("lmsys", 2.0, 7, 2)


# --- run settings (issue 25): configs, compression text, policy parameters ----------------------


def test_config_trace_name_longer_than_the_file_name_limit() -> None:
    """`resolve` looked the trace up with `Path.exists`: a config whose trace name is over 255
    bytes was an OSError (ENAMETOOLONG) from `kvsim run --config` and `kvsim sweep`."""
    from kvsim.errors import UnknownNameError
    from kvsim.resolve import resolve

    _fails(UnknownNameError, lambda: resolve(RunConfig(trace="ag" + "7" * 300)), "trace")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("moe-nd:budget=0.5,n_layers=2424", "n_layers= gives 2,424 layers; at most 256"),
     (f"moe-nd:layers=0.5x4x4*{10**17}", "expected an integer 1-256"),
     ("moe-nd:layers=0.5x4x4*200/1x16x16*100", "at most 256 layers in all")],
)  # fmt: skip
def test_moe_nd_layer_counts_are_bounded(text: str, fragment: str) -> None:
    """The greedy solver takes time as layers squared: `n_layers=2424` ran past the fuzzer's
    10 s limit (found); a `*N` repeat of 10^17 would have built a tuple that large (review)."""
    from kvsim.compression import parse_compression

    _fails(ConfigError, lambda: parse_compression(text), "compression moe-nd", fragment)


def test_moe_nd_sensitivity_table_with_too_many_layers(tmp_path: Path) -> None:
    from kvsim.compression import parse_compression

    path = tmp_path / "s.csv"
    path.write_text("layer,keep,kbits,vbits,loss\n"
                    + "".join(f"{i},1.0,16,16,0\n" for i in range(300)))  # fmt: skip
    _fails(ConfigError, lambda: parse_compression(f"moe-nd:budget=0.5,sensitivity={path}"),
           "sensitivity= gives 300 layers")  # fmt: skip
    assert len(parse_compression("moe-nd:budget=0.5,n_layers=256").layer_configs) == 256


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("bayes-reuse.age_base_s=0", "'age_base_s' must be in (0, 1e9]"),
     ("bayes-reuse.age_bins=-43539082322978350", "'age_bins' must be an integer in [1, 1024]"),
     ('bayes-reuse-v1.kind_map={"user": "nope"}', "'kind_map' maps segment kinds"),
     ("bayes-reuse.gap_edges=[2, 1]", "'gap_edges' must be non-decreasing"),
     ("lru-k.k=32589158477190044729", "'k' must be an integer in [1, 1024]"),
     ("s3fifo.move_to_main_threshold=0", "'move_to_main_threshold'"),
     ("s3fifo.small_size_ratio=2", "'small_size_ratio' must be in [0, 1]"),
     ("2q.a_in_size_ratio=-1", "'a_in_size_ratio' must be in [0, 1]"),
     ("lmcache-cost.sample=0", "'sample' must be an integer"),
     ("lmcache-cost.half_life_s=0", "'half_life_s'"),
     ("ema-head.head_groups=0", "'head_groups'"),
     ("ema-head.retrieval_groups=5", "'retrieval_groups' must be an integer in [0, head_groups"),
     ("ema-head.ema_weight=0", "'ema_weight' must be in (0, 1]"),
     ("asym-cost.prior=[0, 1]", "'prior' must be two numbers")],
)  # fmt: skip
def test_policy_parameters_out_of_range(text: str, fragment: str) -> None:
    """Policy `Params` took any number of the right type: bayes-reuse with `age_base_s=0` was a
    ZeroDivisionError, with `age_bins` negative an IndexError at its first eviction, lru-k with
    `k` past 2^63 an OverflowError at its first block (found); the other policies' parameters
    had no ranges either (review). Each is now one line naming the policy and the parameter."""
    from kvsim.policies import make_policy, parse_policy_params

    ((name, params),) = parse_policy_params(text).items()
    _fails(ConfigError, lambda: make_policy(name, params), f"policy {name!r}", fragment)
    make_policy(name)  # the defaults are in range


@pytest.mark.parametrize(
    ("text", "fragment"),
    [(f"lmcache-cost.half_life_s={10**400}", "expected a finite number"),
     (f"s3fifo.move_to_main_threshold={'7' * 18000}", "expected an integer"),
     (f"lru-k.k={'[' * 100_000}", "expected an integer")],
    ids=["float-overflow", "digits", "deep"],
)  # fmt: skip
def test_plugin_parameter_numbers_too_long(text: str, fragment: str) -> None:
    """`--policy-param` (and `--router-param`, the same parser): an integer past a float's range
    for a float parameter was an OverflowError, an 18,000-digit one a ValueError (int digit
    limit) from the JSON reader (found); brackets 100,000 deep a RecursionError (review)."""
    from kvsim.policies import make_policy, parse_policy_params

    ((name, params),) = parse_policy_params(text).items()
    _fails(ConfigError, lambda: make_policy(name, params), f"policy {name!r}", fragment)


def test_click_error_quoting_an_argument_with_a_newline(capsys: pytest.CaptureFixture) -> None:
    """`kvsim run` given a stray argument holding a newline: click's 'Got unexpected extra
    arguments (...)' quoted it as it was, so the error took two lines (found)."""
    from kvsim.cli import main

    with pytest.raises(SystemExit) as info:
        main(["run", "--trace", "sharegpt", "a\nb", "--max-requests", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvsim: error: "), err
    assert "unexpected extra argument" in err


@pytest.mark.parametrize(
    ("rates", "max_replicas", "fragment"),
    [("1e300x", 64, "rate_scale: 1e+300 is above the largest"),
     ("1x", 1_000_000, "kvsim models at most 100,000")],
)  # fmt: skip
def test_plan_refuses_runs_it_could_not_make(rates: str, max_replicas: int, fragment: str):
    """`kvsim plan` checked its base config, then made runs that `resolve` refuses: a rate scale
    past 10^6, or a largest fleet of more GPUs than kvsim models; each failed only once the search
    reached it. `check_runs` now resolves every rate on every router's largest fleet first."""
    from kvsim.plan import PlanSettings, check_runs, parse_rates, resolve_rates

    settings = PlanSettings(RunConfig(trace="sharegpt", max_requests=20), 2.0, 0.1,
                            max_replicas=max_replicas)  # fmt: skip
    resolved = resolve_rates(parse_rates(rates), 1.0)
    _fails(ConfigError, lambda: check_runs(settings, resolved), f"--rates {rates}", fragment)
    check_runs(dataclasses.replace(settings, max_replicas=64), resolve_rates(parse_rates("1x"), 1))


@pytest.mark.parametrize(
    ("engine", "fragment"),
    [({"replicas": 2**32}, "4,294,967,296 replicas of 1 GPU need"),
     ({"pd": f"1:{2**32}"}, "4,294,967,297 replicas of 1 GPU need")],
)  # fmt: skip
def test_replica_count_is_bounded_before_anything_is_built(engine: dict, fragment: str) -> None:
    """`kvsim run --replicas 4294967296` was a MemoryError: `resolve` built a role per replica
    before checking the GPU count against its bound (found); a P/D split that large, the same
    (review)."""
    from kvsim.engine.config import EngineConfig
    from kvsim.resolve import resolve

    config = RunConfig(model="qwen2.5-0.5b", engine=EngineConfig(**engine))
    _fails(ConfigError, lambda: resolve(config), "engine.replicas", fragment, "at most 100,000")


def test_compression_table_name_holding_a_nul_byte() -> None:
    """`--compression moe-nd:table=<NUL>`: opening the name was a ValueError (embedded null
    byte) from the file reader every kvsim reader shares (found)."""
    from kvsim.compression import parse_compression

    _fails(ConfigError, lambda: parse_compression("moe-nd:table=a\x00b"), "no such file")

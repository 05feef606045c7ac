"""Fuzz every trace loader, the profile, model and run-config readers (issue 10), and the readers
of run settings: sweep specs, plan and run options, compression and plugin-parameter text (25).

Each target is a hypothesis test that builds a file from real samples (the shipped traces, the
shipped hardware profiles, the model catalog, a default run config), mutates it (wrong types,
huge, negative and non-finite numbers, missing and unknown keys, unicode, lone surrogates, cut
lines, stray bytes, corrupt gzip, deep nesting, empty files, raw bytes), writes it to a temporary
file and calls the real reader, the way the CLI does. A `KvsimError` is a correct answer; any
other exception, a hang (over `--hang-s` seconds on one input) or a loaded result that breaks the
reader's own contract (a trace table that fails `validate_trace`, a profile whose iteration time
is not finite, a config that does not survive being written and read again, a command whose
exit 2 does not end in one `kvsim: error:` line) is a crasher: its input is saved under
`--save DIR` with its traceback, and printed.

Each target runs in its own process, bounded by `--seconds` of wall time and `--mem-gib` of
address space (so a runaway allocation is a MemoryError, not a dead machine); a process that dies
is reported with the input it was on. Reports figures and asserts none. Run:

    python benchmarks/fuzz_inputs.py [--seconds 60] [--only NAME[,NAME]] [--save DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime as dt
import gzip
import io
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
NAN, INF = float("nan"), float("inf")

# --- values that break readers --------------------------------------------------------------------

EDGE_INTS = [0, 1, -1, 2, 3, 16, 511, 512, 513, 4096, 2**31 - 1, 2**31, 2**32, 2**53 + 1,
             2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**8, 10**8 + 1, 10**12, 10**19,
             10**30, 10**400]  # fmt: skip
EDGE_FLOATS = [0.0, -0.0, 0.5, -1.5, 1e-300, 5e-324, 1e15, 1.5e12, 1e300, 1.7976931348623157e308,
               NAN, INF, -INF]  # fmt: skip
EDGE_TEXT = [
    "", " ", "0", "-1", "1", "12", "1.5", "-0", "1e999", "-1e999", "1e-999", "nan", "NaN", "inf",
    "Infinity", "0x1F", "1_000", "１２", "12abc", " 7 ", "null", "true", "\x00", "\ufeff", "é",
    "日本語", "😀", "\ud800", "a" * 3000, '"', ",", "\n", "\r\n", "\\", "{", "[", "]",
    "2023-11-16 18:15:46.6805900", "2024-05-10 00:00:00.123+00:00", "2023-02-30 00:00:00",
    "9999-12-31 23:59:59.999999999", "0001-01-01 00:00:00", "1970-01-01T00:00:00+25:00",
    "Gamma", "Weibull", "human", "gpt", "assistant", "user", "system", "tool", "document",
    "opaque", "request_end", "tool_end", "bf16", "fp8", "int4", "hbm", "dram", "nvme", "rdma",
    "gds", "bounce", "per_gpu", "per_node", "80GiB", "0GiB", "-1GB", "1e400TB", "1000",
    "3.35TB/s", "0B/s", "/s", "3us", "-1ns", "1e999s", "0ms", "nanGB", "lru", "arc",
    "hbm=lru,dram=arc", "1:1", "0:1", "a:b", "full", "sliding", "mla", "linear", "none",
    "llama-3.1-8b", "h100-sxm", "sharegpt", "mooncake", "servegen:x/y", "poisson", "gamma",
    "lru.x=1", "S1 datasheet", "assumption: x", "/", ".", "..", "~", "a\x00b", "x.toml",
]  # fmt: skip


def scalar_json() -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from(EDGE_INTS),
        st.sampled_from(EDGE_FLOATS),
        st.sampled_from(EDGE_TEXT),
        st.integers(),
        st.floats(),
        st.text(max_size=24),
        st.booleans(),
        st.none(),
    )


def scalar_toml() -> st.SearchStrategy:
    """TOML has no null, but has dates and times."""
    return st.one_of(
        st.sampled_from(EDGE_INTS),
        st.sampled_from(EDGE_FLOATS),
        st.sampled_from(EDGE_TEXT),
        st.integers(),
        st.floats(),
        st.text(max_size=24),
        st.booleans(),
        st.datetimes(timezones=st.none() | st.just(dt.UTC)),
        st.dates(),
        st.times(),
    )


def scalar_cell() -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from(EDGE_TEXT),
        st.integers().map(str),
        st.floats().map(repr),
        st.text(max_size=16),
    )


def tree(leaf: st.SearchStrategy, keys: list[str]) -> st.SearchStrategy:
    key = st.sampled_from(keys) | st.text(max_size=8) if keys else st.text(max_size=8)
    return st.recursive(
        leaf,
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(key, kids, max_size=4),
        max_leaves=6,
    )


# --- mutation of structured documents -------------------------------------------------------------


def _tweak_number(data: st.DataObject, value: int | float) -> Any:
    how = data.draw(st.sampled_from(["neg", "scale", "inc", "dec", "float", "str", "int", "zero"]))
    if how == "neg":
        return -value
    if how == "scale":
        factor = data.draw(st.sampled_from([10**3, 10**9, 10**20, 10**400, 1e300, 0.5, 1e-9]))
        try:
            return value * factor
        except OverflowError:
            return INF
    if how == "inc":
        return value + 1
    if how == "dec":
        return value - 1
    if how == "float":
        try:
            return float(value)
        except OverflowError:
            return INF
    if how == "str":
        return str(value)
    if how == "int":
        return value if isinstance(value, int) else int(value) if math.isfinite(value) else 2**64
    return 0


def _tweak_text(data: st.DataObject, value: str) -> Any:
    how = data.draw(st.sampled_from(["empty", "repeat", "append", "cut", "upper", "number"]))
    if how == "empty":
        return ""
    if how == "repeat":  # long, not huge: a 100 MB profile tests tomllib's speed, not kvsim
        times = data.draw(st.sampled_from([2, 50, 2000]))
        return value * (times if len(value) * times <= 100_000 else 2)
    if how == "append":
        return value + data.draw(st.sampled_from(EDGE_TEXT) | st.text(max_size=8))
    if how == "cut":
        return value[: data.draw(st.integers(0, max(len(value) - 1, 0)))]
    if how == "upper":
        return value.upper()
    with contextlib.suppress(ValueError):
        return int(value)
    with contextlib.suppress(ValueError):
        return float(value)
    return data.draw(st.sampled_from(EDGE_INTS))


def change(data: st.DataObject, value: Any, leaf: st.SearchStrategy, keys: list[str]) -> Any:
    """`value` changed at its root: replaced, or a key or item dropped, added or duplicated."""
    ops = ["replace", "replace"]
    if isinstance(value, dict):
        ops += ["drop", "drop", "add", "rename", "empty", "to-list"]
    elif isinstance(value, list):
        ops += ["drop", "drop", "dup", "append", "empty", "reverse", "to-dict"]
    elif isinstance(value, bool):
        ops += ["flip"]
    elif isinstance(value, int | float):
        ops += ["tweak", "tweak", "tweak"]
    elif isinstance(value, str):
        ops += ["tweak", "tweak"]
    op = data.draw(st.sampled_from(ops))
    if op == "replace":
        return data.draw(leaf if data.draw(st.integers(0, 3)) else tree(leaf, keys))
    if op == "flip":
        return not value
    if op == "tweak":
        if isinstance(value, str):
            return _tweak_text(data, value)
        return _tweak_number(data, value)
    if op == "empty":
        return type(value)()
    if op == "to-list":
        return list(value.values())
    if op == "to-dict":
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        if op == "drop" and value:
            key = data.draw(st.sampled_from(list(value)))
            return {k: v for k, v in value.items() if k != key}
        if op == "rename" and value:
            key = data.draw(st.sampled_from(list(value)))
            new = data.draw(st.sampled_from(keys) | st.text(max_size=8)) if keys else key + "_"
            return {(new if k == key else k): v for k, v in value.items()}
        new = data.draw(st.sampled_from(keys) | st.text(max_size=8)) if keys else "x"
        return {**value, new: data.draw(leaf)}
    if op == "drop" and value:
        i = data.draw(st.integers(0, len(value) - 1))
        return value[:i] + value[i + 1 :]
    if op == "dup" and value:
        i = data.draw(st.integers(0, len(value) - 1))
        return value[: i + 1] + value[i:]
    if op == "reverse":
        return value[::-1]
    return [*value, data.draw(leaf)]


def mutate(data: st.DataObject, value: Any, leaf: st.SearchStrategy, keys: list[str]) -> Any:
    """`value` with one change somewhere inside it (a new object; `value` is left alone)."""
    if isinstance(value, dict) and value and data.draw(st.integers(0, 3)):
        key = data.draw(st.sampled_from(list(value)))
        return {**value, key: mutate(data, value[key], leaf, keys)}
    if isinstance(value, list) and value and data.draw(st.integers(0, 3)):
        i = data.draw(st.integers(0, len(value) - 1))
        return [*value[:i], mutate(data, value[i], leaf, keys), *value[i + 1 :]]
    return change(data, value, leaf, keys)


def mutate_many(data: st.DataObject, value: Any, leaf: st.SearchStrategy, keys: list[str]) -> Any:
    for _ in range(data.draw(st.integers(0, 4))):
        value = mutate(data, value, leaf, keys)
    return value


def mutate_bytes(data: st.DataObject, raw: bytes) -> bytes:
    """Usually nothing; else a cut, stray bytes, a deleted or doubled span, CRLF, a BOM, deep
    nesting, or raw bytes instead of the file."""
    op = data.draw(st.sampled_from(["none"] * 6 + ["cut", "insert", "byte", "delete", "dup",
                                    "crlf", "bom", "deep", "digits", "raw", "empty"]))  # fmt: skip
    if op == "none":
        return raw
    if op == "raw":
        return data.draw(st.binary(max_size=400))
    if op == "empty":
        return b""
    if op == "crlf":
        return raw.replace(b"\n", b"\r\n")
    if op == "bom":
        return b"\xef\xbb\xbf" + raw
    at = data.draw(st.integers(0, len(raw)))
    if op == "cut":
        return raw[:at]
    if op == "insert":
        return raw[:at] + data.draw(st.binary(min_size=1, max_size=16)) + raw[at:]
    if op == "deep":
        nest = data.draw(st.sampled_from([b"[", b'{"a":', b"a = ["]))
        return raw[:at] + nest * 60_000 + raw[at:]
    if op == "digits":  # past Python's 4300-digit limit for int()
        return raw[:at] + b"7" * data.draw(st.sampled_from([400, 5000])) + raw[at:]
    if op == "byte" and at < len(raw):
        return raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1 :]
    end = data.draw(st.integers(at, min(len(raw), at + 64)))
    if op == "delete":
        return raw[:at] + raw[end:]
    return raw[:end] + raw[at:end] + raw[end:]


# --- serialisers ----------------------------------------------------------------------------------


def json_bytes(data: st.DataObject, value: Any, indent: bool = False) -> bytes:
    ascii_only = data.draw(st.booleans())
    text = json.dumps(value, ensure_ascii=ascii_only, indent=1 if indent else None)
    return text.encode("utf-8", "surrogatepass")


def as_rows(value: Any) -> list[Any]:
    """A mutated list of rows that may have been replaced by a scalar or a mapping."""
    return value if isinstance(value, list) else [value]


def jsonl_bytes(data: st.DataObject, rows: list[Any]) -> bytes:
    rows = as_rows(rows)
    lines = [json_bytes(data, row) for row in rows]
    sep = data.draw(st.sampled_from([b"\n", b"\n", b"\r\n", b"\n\n"]))
    return sep.join(lines) + (sep if data.draw(st.booleans()) else b"")


def _toml_key(key: str) -> str:
    return json.dumps(key)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = (f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(items) + "}"
    return json.dumps(str(value))


def toml_bytes(doc: Any) -> bytes:
    """TOML for any tree: top-level scalars first, then one [table] or [[array]] per nested key."""
    if not isinstance(doc, dict):
        return f"value = {toml_value(doc)}\n".encode("utf-8", "surrogatepass")
    lines = [f"{_toml_key(k)} = {toml_value(v)}" for k, v in doc.items()
             if v is not None and not isinstance(v, dict | list)]  # fmt: skip
    for key, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"[{_toml_key(key)}]")
            lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()
                      if v is not None]  # fmt: skip
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                lines.append(f"[[{_toml_key(key)}]]")
                lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in item.items()
                          if v is not None]  # fmt: skip
        elif isinstance(value, list):
            lines.append(f"{_toml_key(key)} = {toml_value(value)}")
    # Scalars after a [table] header would land inside it: they were written first, above.
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


def csv_bytes(data: st.DataObject, rows: list[Any]) -> bytes:
    rows = [r if isinstance(r, list) else [r] for r in as_rows(rows)]
    rows = [r if isinstance(r, list) else [r] for r in rows]
    rows = [[c if isinstance(c, str) else json.dumps(c) for c in r] for r in rows]
    end = data.draw(st.sampled_from(["\n", "\n", "\r\n"]))
    if data.draw(st.booleans()):
        text = end.join(",".join(r) for r in rows) + end
    else:
        buf = io.StringIO()
        quoting = data.draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
        csv.writer(buf, lineterminator=end, quoting=quoting).writerows(rows)
        text = buf.getvalue()
    return text.encode("utf-8", "surrogatepass")


def maybe_gzip(data: st.DataObject, raw: bytes) -> tuple[bytes, bool]:
    if not data.draw(st.booleans()):
        return raw, False
    packed = gzip.compress(raw, mtime=0)
    if data.draw(st.integers(0, 3)) == 0:  # a cut or damaged stream
        packed = mutate_bytes(data, packed)
    return packed, True


# --- seeds: real samples --------------------------------------------------------------------------


def _jsonl_rows(path: Path, limit: int) -> list[Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) >= limit:
                break
    return rows


def _csv_rows(path: Path, limit: int) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [row for _, row in zip(range(limit), csv.reader(handle), strict=False)]


def _short(value: Any, size: int = 120) -> Any:
    """The document with long strings cut, so seeds stay small."""
    if isinstance(value, str):
        return value[:size]
    if isinstance(value, list):
        return [_short(v, size) for v in value]
    if isinstance(value, dict):
        return {k: _short(v, size) for k, v in value.items()}
    return value


def sharegpt_texts() -> list[str]:
    data = json.loads((REPO / "traces/sharegpt/ShareGPT_V3_filtered_500.json").read_text())
    return [_short(c["conversations"][0]["value"], 200) for c in data[:40]]


# --- targets --------------------------------------------------------------------------------------


class BadOutput(Exception):
    """The reader accepted the input but its result breaks the reader's own contract."""


@dataclass
class Target:
    name: str
    what: str
    #: Draws one input: the file's bytes, its file name, and reader options.
    make: Callable[[st.DataObject], tuple[bytes, str, dict[str, Any]]]
    #: Reads the file the way kvsim does; raises BadOutput on an impossible result.
    run: Callable[[Path, dict[str, Any]], None]
    prepare: Callable[[Path], None] = lambda work: None


def check_trace(trace: Any) -> None:
    from kvsim.errors import TraceError
    from kvsim.traces.schema import validate_trace

    try:
        validate_trace(trace.table, "loaded trace")
    except TraceError as exc:
        raise BadOutput(f"loader returned an invalid canonical table: {exc}") from None
    if len(trace) == 0:
        raise BadOutput("loader returned an empty trace instead of an error")


def trace_options(data: st.DataObject, fmt: str, modes: tuple[str, ...] = ("load", "convert")):
    return {
        "format": data.draw(st.sampled_from([fmt, None])),
        "skip": data.draw(st.booleans()),
        "mode": data.draw(st.sampled_from(modes)),
        "max_requests": data.draw(st.sampled_from([None, None, 1, 3])),
        "rate_scale": data.draw(st.sampled_from([1.0, 1.0, 2.5])),
    }


def run_trace(path: Path, opts: dict[str, Any]) -> None:
    from kvsim.traces import load_trace, read_trace
    from kvsim.traces.convert import convert_to_parquet
    from kvsim.traces.registry import open_source

    if opts["mode"] == "convert":
        out = path.with_name("converted.parquet")
        with contextlib.suppress(FileNotFoundError):
            out.unlink()
        source = open_source(path, format=opts["format"], skip_bad_rows=opts["skip"])
        convert_to_parquet(source, out)
        check_trace(read_trace(out))
        return
    trace = load_trace(
        path,
        format=opts["format"],
        skip_bad_rows=opts["skip"],
        max_requests=opts["max_requests"],
        rate_scale=opts["rate_scale"],
    )
    check_trace(trace)


def jsonl_target(name: str, fmt: str, seeds: Callable[[], list[Any]], keys: list[str]) -> Target:
    cache: list[list[Any]] = []

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        rows = data.draw(st.lists(st.sampled_from(cache[0]), max_size=6))
        rows = mutate_many(data, rows, scalar_json(), keys)
        raw = mutate_bytes(data, jsonl_bytes(data, rows))
        raw, packed = maybe_gzip(data, raw)
        return raw, "t.jsonl.gz" if packed else "t.jsonl", trace_options(data, fmt)

    return Target(name, f"{fmt} JSONL", make, run_trace)


def mooncake_seeds() -> list[Any]:
    rows = _jsonl_rows(REPO / "traces/mooncake/mooncake_trace_1000.jsonl", 30)
    rows += _jsonl_rows(REPO / "traces/mooncake/conversation_trace.jsonl", 20)
    return rows + _jsonl_rows(REPO / "traces/mooncake/synthetic_trace.jsonl", 20)


def dynamo_seeds() -> list[Any]:
    return _jsonl_rows(REPO / "traces/dynamo/pi_request_trace.jsonl.gz", 200)


def kvsim_jsonl_seeds() -> list[Any]:
    text = (REPO / "docs/traces.md").read_text()
    block = text.split("```jsonl\n", 1)[1].split("```", 1)[0]
    rows = [json.loads(line) for line in block.splitlines() if line.strip()]
    for i, row in enumerate(_jsonl_rows(REPO / "traces/mooncake/mooncake_trace_1000.jsonl", 10)):
        segs = [[h, 512, "opaque"] for h in row["hash_ids"]]
        segs[-1][1] = row["input_length"] - 512 * (len(segs) - 1)
        rows.append({"arrival_s": row["timestamp"] / 1000, "session": i % 3, "turn": i // 3,
                     "think_time_s": 0.5 if i >= 3 else None, "input_tokens": row["input_length"],
                     "output_tokens": row["output_length"], "output_hash": 1000 + i,
                     "segments": segs})  # fmt: skip
    return rows


MOONCAKE_KEYS = ["timestamp", "input_length", "output_length", "hash_ids"]
DYNAMO_KEYS = ["timestamp", "event", "event_type", "request", "replay", "input_tokens",
               "output_tokens", "trace_block_size", "input_sequence_hashes", "agent_context",
               "session_id", "parent_session_id", "tool", "duration_ms", "request_received_ms",
               "event_time_unix_ms", "total_time_ms"]  # fmt: skip
JSONL_KEYS = ["arrival_s", "segments", "output_tokens", "output_hash", "session", "turn",
              "think_time_s", "input_tokens", "hash", "tokens", "kind"]  # fmt: skip


def sharegpt_target() -> Target:
    cache: list[list[Any]] = []

    def seeds() -> list[Any]:
        texts = sharegpt_texts()
        roles = ["human", "gpt", "human", "gpt", "system", "user", "chatgpt", "bard", "assistant"]
        convs = []
        for i in range(20):
            turns = [{"from": roles[(j if i % 2 else j % 2)], "value": texts[(i + j) % len(texts)]}
                     for j in range(1 + i % 5)]  # fmt: skip
            convs.append({"id": f"c{i}", "conversations": turns})
        return convs

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        doc = data.draw(st.lists(st.sampled_from(cache[0]), max_size=5))
        doc = mutate_many(data, doc, scalar_json(), ["id", "conversations", "from", "value"])
        raw = mutate_bytes(data, json_bytes(data, doc, indent=data.draw(st.booleans())))
        return raw, "t.json", trace_options(data, "sharegpt", ("load", "convert", "first-turns"))

    def run(path: Path, opts: dict[str, Any]) -> None:
        if opts["mode"] == "first-turns":  # the built-in `sharegpt` trace's reader of its sample
            from kvsim.traces.sharegpt import load_sharegpt

            check_trace(load_sharegpt(path, max_requests=20))
            return
        run_trace(path, opts)

    return Target("sharegpt", "ShareGPT JSON (and the first-turn sample reader)", make, run)


def swe_agent_target() -> Target:
    cache: list[list[Any]] = []

    def seeds() -> list[Any]:
        docs = []
        for path in sorted((REPO / "traces/swe-agent").glob("*.traj")):
            doc = json.loads(path.read_text())
            docs.append(_short({"history": doc["history"][:8],
                                "trajectory": doc["trajectory"][:4]}))  # fmt: skip
        return docs

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        doc = data.draw(st.sampled_from(cache[0]))
        keys = ["history", "trajectory", "role", "content", "execution_time", "text", "type"]
        doc = mutate_many(data, doc, scalar_json(), keys)
        raw = mutate_bytes(data, json_bytes(data, doc))
        return raw, "t.traj", trace_options(data, "swe-agent")

    return Target("swe-agent", "SWE-agent .traj JSON", make, run_trace)


def csv_target(name: str, fmt: str, seeds: Callable[[], list[list[list[str]]]]) -> Target:
    cache: list[list[Any]] = []

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        head, *rows = data.draw(st.sampled_from(cache[0]))
        picked = data.draw(st.lists(st.sampled_from(rows), max_size=6))
        table = mutate_many(data, [head, *picked], scalar_cell(), [])
        raw = mutate_bytes(data, csv_bytes(data, table))
        return raw, "t.csv", trace_options(data, fmt)

    return Target(name, f"{fmt} CSV", make, run_trace)


def azure_seeds() -> list[list[list[str]]]:
    code = _csv_rows(REPO / "traces/azure/AzureLLMInferenceTrace_code.csv", 30)
    conv = _csv_rows(REPO / "traces/azure/AzureLLMInferenceTrace_conv.csv", 30)
    late = [["2024-05-10 00:00:00.123+00:00", "100", "20"], ["2024-05-10 00:00:01+00:00", "7", "1"]]
    return [code, conv, [code[0], *late]]


def burstgpt_seeds() -> list[list[list[str]]]:
    head = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type",
            "Session ID"]  # fmt: skip
    rows = [
        ["5", "ChatGPT", "472", "18", "490", "Conversation log", "s1"],
        ["45", "ChatGPT", "1087", "0", "1087", "Conversation log", "s1"],
        ["118", "GPT-4", "417", "276", "693", "API log", ""],
        ["118.5", "ChatGPT", "1360", "53", "1413", "Conversation log", "s2"],
        ["1.2e3", "GPT-4", "33", "1", "34", "API log", "s2"],
    ]
    return [[head, *rows], [head[:6], *(r[:6] for r in rows)]]


def servegen_target() -> Target:
    """A ServeGen client file read as `--arrival servegen:GROUP/CHUNK` over a small trace."""
    cache: list[list[Any]] = []

    def seeds() -> list[list[str]]:
        rows = []
        for path in sorted((REPO / "traces/servegen").glob("*/*-trace.csv")):
            rows += _csv_rows(path, 12)
        return rows

    def prepare(work: Path) -> None:
        os.environ["KVSIM_TRACES"] = str(work)
        (work / "servegen" / "fz").mkdir(parents=True, exist_ok=True)
        base = [{"arrival_s": float(i), "session": i % 7, "output_tokens": 5,
                 "segments": [[i + 1, 40, "user"]]} for i in range(30)]  # fmt: skip
        (work / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        rows = data.draw(st.lists(st.sampled_from(cache[0]), min_size=1, max_size=8))
        rows = mutate_many(data, rows, scalar_cell(), [])
        raw = mutate_bytes(data, csv_bytes(data, rows))
        opts = {"rate": data.draw(st.sampled_from([None, 0.5, 40.0])),
                "seed": data.draw(st.integers(0, 3))}  # fmt: skip
        return raw, "servegen/fz/chunk-1-trace.csv", opts

    def run(path: Path, opts: dict[str, Any]) -> None:
        from kvsim.traces import load_trace

        base = path.parents[2] / "base.jsonl"
        trace = load_trace(base, arrival="servegen:fz/chunk-1", rate=opts["rate"],
                           seed=opts["seed"])  # fmt: skip
        check_trace(trace)

    return Target("servegen", "ServeGen client CSV (--arrival servegen)", make, run, prepare)


def parquet_bytes(table: Any, row_group_size: int, rows: list[Any], schema: Any) -> bytes:
    """The table as Parquet; a table Parquet refuses (nulls in a non-nullable column) is replaced
    by the unmutated `rows`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    try:
        pq.write_table(table, buf, row_group_size=row_group_size)
    except Exception:  # not writable as it is: fall back to the seed
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf)
    return buf.getvalue()


def lmsys_target() -> Target:
    import pyarrow as pa

    cache: list[list[Any]] = []
    message = pa.struct([("content", pa.string()), ("role", pa.string())])
    schemas = [
        pa.schema([("conversation_id", pa.string()), ("conversation", pa.list_(message))]),
        pa.schema([("conversation_id", pa.string()), ("model", pa.string()),
                   ("conversation", pa.large_list(pa.struct([("role", pa.large_string()),
                                                              ("content", pa.large_string())])))]),
        pa.schema([("conversation_id", pa.int64()), ("conversation", pa.list_(pa.struct(
            [("content", pa.string()), ("role", pa.string()), ("turn", pa.int32())])))]),
        None,  # inferred from the (mutated) values
    ]  # fmt: skip

    def seeds() -> list[Any]:
        texts = sharegpt_texts()
        roles = ["user", "assistant", "user", "assistant", "system"]
        return [{"conversation_id": str(i), "model": "vicuna",
                 "conversation": [{"content": texts[(i + j) % len(texts)], "role": roles[j]}
                                  for j in range(1 + i % 5)]} for i in range(20)]  # fmt: skip

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        rows = data.draw(st.lists(st.sampled_from(cache[0]), max_size=5))
        rows = mutate_many(data, rows, scalar_json(), ["conversation_id", "conversation",
                                                       "content", "role"])  # fmt: skip
        schema = data.draw(st.sampled_from(schemas))
        table = None
        for attempt in (schema, None):
            try:
                table = pa.Table.from_pylist(rows, schema=attempt)
                break
            except Exception:  # values pyarrow cannot hold: try the next schema
                continue
        if table is None:
            table = pa.Table.from_pylist(cache[0][:2], schema=schemas[0])
        groups = data.draw(st.sampled_from([1, 2, 1000]))
        raw = mutate_bytes(data, parquet_bytes(table, groups, cache[0][:2], schemas[0]))
        return raw, "t.parquet", trace_options(data, "lmsys")

    return Target("lmsys", "LMSYS-Chat-1M Parquet", make, run_trace)


def canonical_target() -> Target:
    import pyarrow as pa

    from kvsim.traces.schema import (
        META_BLOCK,
        META_DESCRIPTION,
        META_NAME,
        META_SKIPPED,
        TRACE_SCHEMA,
    )

    cache: list[Any] = []
    types = [pa.int32(), pa.int64(), pa.uint64(), pa.float32(), pa.float64(), pa.string(),
             pa.large_string(), pa.bool_()]  # fmt: skip

    def seeds() -> list[Any]:
        from kvsim.traces import load_trace

        tables = [load_trace("mooncake-arxiv-1000", max_requests=8).table,
                  load_trace("sharegpt", max_requests=10).table,
                  load_trace("pi-coding-agent", max_requests=6).table]  # fmt: skip
        return [(t.to_pylist(), t.schema.metadata) for t in tables]

    def make(data: st.DataObject):
        if not cache:
            cache.extend(seeds())
        rows, meta = data.draw(st.sampled_from(cache))
        keys = [f.name for f in TRACE_SCHEMA] + ["hash", "tokens", "kind"]
        rows = mutate_many(data, rows, scalar_json(), keys)
        table = None
        for schema in (TRACE_SCHEMA, None):
            try:
                table = pa.Table.from_pylist(rows, schema=schema)
                break
            except Exception:  # values pyarrow cannot hold: try the next schema
                continue
        if table is None:
            table = pa.Table.from_pylist(cache[0][0], schema=TRACE_SCHEMA)
        for _ in range(data.draw(st.integers(0, 2))):
            table = _column_op(data, table, types)
        meta = dict(meta or {})
        names = [META_BLOCK, META_SKIPPED, META_NAME, META_DESCRIPTION]
        for key in data.draw(st.lists(st.sampled_from(names), max_size=2)):
            meta[key] = data.draw(st.sampled_from([b"", b"-1", b"abc", b"1e3", b"\xff\xfe",
                                                   b"99999999999999999999999", b"0", b" 16 "])
                                  | st.binary(max_size=8))  # fmt: skip
        table = table.replace_schema_metadata(meta)
        groups = data.draw(st.sampled_from([2, 1000]))
        raw = mutate_bytes(data, parquet_bytes(table, groups, cache[0][0], TRACE_SCHEMA))
        return raw, "t.parquet", trace_options(data, "canonical", ("load", "read"))

    def run(path: Path, opts: dict[str, Any]) -> None:
        if opts["mode"] == "read":
            from kvsim.traces import read_trace

            check_trace(read_trace(path, opts["skip"]))
            return
        run_trace(path, opts)

    return Target("canonical", "canonical Parquet", make, run)


def _column_op(data: st.DataObject, table: Any, types: list[Any]) -> Any:
    import pyarrow as pa

    if table.num_columns == 0:
        return table
    i = data.draw(st.integers(0, table.num_columns - 1))
    op = data.draw(st.sampled_from(["drop", "cast", "nulls", "rename", "slice", "concat", "swap"]))
    try:
        if op == "drop":
            return table.remove_column(i)
        if op == "cast":
            target = data.draw(st.sampled_from(types))
            column = table.column(i).cast(target, safe=False)
            return table.set_column(i, table.field(i).name, column)
        if op == "nulls":
            return table.set_column(
                i, pa.field(table.field(i).name, table.field(i).type, nullable=True),
                pa.nulls(table.num_rows, table.field(i).type),
            )  # fmt: skip
        if op == "rename":
            names = list(table.column_names)
            names[i] = data.draw(st.sampled_from(["conversation", "x", "segments", ""]))
            return table.rename_columns(names)
        if op == "slice":
            return table.slice(0, data.draw(st.integers(0, table.num_rows)))
        if op == "concat":
            return pa.concat_tables([table, table])
        j = data.draw(st.integers(0, table.num_columns - 1))
        names = list(table.column_names)
        names[i], names[j] = names[j], names[i]
        return table.select(names)
    except Exception:  # an operation this table cannot take: leave it as it is
        return table


def toml_target(name: str, what: str, seeds: Callable[[], list[dict]], keys: list[str],
                run: Callable[[Path, dict[str, Any]], None]) -> Target:  # fmt: skip
    cache: list[list[dict]] = []

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        doc = data.draw(st.sampled_from(cache[0]))
        doc = mutate_many(data, doc, scalar_toml(), keys)
        raw = mutate_bytes(data, toml_bytes(doc))
        return raw, "t.toml", {}

    return Target(name, what, make, run)


def profile_seeds() -> list[dict]:
    import tomllib

    paths = sorted((REPO / "hardware_profiles").glob("*.toml"))
    docs = [tomllib.loads(p.read_text()) for p in paths]
    docs.append({**docs[0], "measured": _measured_tables()})
    return docs


def _measured_tables() -> dict[str, Any]:
    """A [measured] table in the shape `kvsim calibrate` writes (synthetic numbers)."""
    from kvsim.costmodel.shapes import gemm_shapes
    from kvsim.models import load_model

    model = load_model("qwen2.5-0.5b")
    tokens = [1, 4, 16, 64, 256]
    gemm = {name: {"k": s.k, "n": s.n, "calls": s.calls, "per": s.per, "tokens": tokens,
                   "seconds": [2.0 * m * s.k * s.n / 1e12 + 1e-6 for m in tokens]}
            for name, s in gemm_shapes(model).items()}  # fmt: skip
    return {
        "device": "synthetic", "device_kind": "cpu", "driver": "none", "torch": "none",
        "date": "2026-01-01T00:00:00Z", "model": model.name, "tp": 1, "dtype": "bf16",
        "kv_dtype": "bf16", "overhead_s": 1e-4, "gemm": gemm,
        "elementwise": {"tokens": tokens, "seconds": [1e-6 * m for m in tokens]},
        "prefill_attention": {"tokens": [16, 64, 256], "context": [0, 0, 0],
                              "seconds": [1e-5, 1e-4, 1e-3]},
        "decode_attention": {"batch": [1, 4, 16], "context": [64, 256, 1024],
                             "seconds": [[1e-6 * b * c / 64 for c in (64, 256, 1024)]
                                         for b in (1, 4, 16)]},
        "copy": {"h2d": {"bytes": [4096, 1 << 20, 1 << 24], "seconds": [1e-5, 1e-4, 1e-3]}},
        "storage": {"path": "gds", "bytes": [4096, 1 << 20], "seconds": [1e-4, 1e-3]},
    }  # fmt: skip


PROFILE_KEYS = ["name", "description", "gpus_per_node", "gpu_usd_per_hour",
                "gpu_memory_utilization", "gpu", "efficiency", "tiers", "sources", "measured",
                "hbm", "hbm_bandwidth", "flops", "bf16", "fp8", "capacity", "read_bandwidth",
                "write_bandwidth", "bandwidth_scope", "latency", "enabled", "path",
                "shared_by_nodes", "tokens", "seconds", "context", "batch", "bytes"]  # fmt: skip


def run_profile(path: Path, opts: dict[str, Any]) -> None:
    from kvsim.costmodel import TransferModel, make_cost_model
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    profile = load_profile(path)
    cost = make_cost_model(load_model("qwen2.5-0.5b"), profile)
    seconds = cost.iteration_time_s([(256, 0)], [100, 1000])
    if not (math.isfinite(seconds) and seconds > 0):
        raise BadOutput(f"validated profile gives iteration time {seconds!r}")
    transfers = TransferModel(profile)
    for tier in profile.tiers[1:]:
        for write in (False, True):
            t = transfers.time_s(tier.name, 1 << 20, write=write)
            if not (math.isfinite(t) and t > 0):
                raise BadOutput(f"validated profile gives {tier.name} transfer time {t!r}")


def model_seeds() -> list[dict]:
    import tomllib

    catalog = REPO / "kvsim" / "catalog"
    return [tomllib.loads(p.read_text()) for p in sorted(catalog.glob("*.toml"))]


MODEL_KEYS = ["name", "hf_config", "hidden_size", "num_layers", "num_attention_heads",
              "vocab_size", "tie_word_embeddings", "norms_per_layer", "weight_dtype",
              "layer_groups", "mlp_groups", "kind", "layers", "num_heads", "num_kv_heads",
              "head_dim", "window", "kv_lora_rank", "qk_rope_head_dim", "intermediate_size",
              "num_experts", "experts_per_token", "mamba_expand",
              "state_bytes_per_seq"]  # fmt: skip


def run_model(path: Path, opts: dict[str, Any]) -> None:
    """`kvsim size --model FILE`: read the model, then size it on a shipped profile."""
    from kvsim.capacity import node_tier_capacity, profile_capacity_report
    from kvsim.costmodel import make_cost_model
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    spec = load_model(str(path))
    profile = load_profile("h100-sxm")
    options = {"tp": 1, "kv_dtype": "bf16", "weight_dtype": spec.weight_dtype, "block_size": 16}
    report = profile_capacity_report(spec, profile, context_tokens=4096, strict=False, **options)
    if report["fits"]:
        node_tier_capacity(spec, profile, **options)
    per_token = report["kv_bytes_per_token_per_replica"]
    if not (isinstance(per_token, int | float) and per_token >= 0 and math.isfinite(per_token)):
        raise BadOutput(f"validated model gives {per_token!r} KV bytes per token")
    seconds = make_cost_model(spec, profile).iteration_time_s([(256, 0)], [100, 1000])
    if not (math.isfinite(seconds) and seconds > 0):
        raise BadOutput(f"validated model gives iteration time {seconds!r}")


def full_config() -> Any:
    """A run config that sets every key to a value other than its default (and runs)."""
    from kvsim.config import RunConfig
    from kvsim.engine.config import EngineConfig

    return RunConfig(
        trace="mooncake-conversation", max_requests=40, rate=None, rate_scale=1.5,
        arrival="gamma", cv=1.5, trace_format=None, tokenizer=None, skip_bad_rows=True,
        model="qwen2.5-0.5b", weight_dtype="fp8", hardware="h200-sxm", slo_ttft_s=2.0,
        slo_tpot_s=0.1,
        engine=EngineConfig(
            block_size=32, max_num_seqs=64, max_num_batched_tokens=4096, chunked_prefill=False,
            num_scheduler_steps=2, kv_reservation="full", tp=2, kv_dtype="fp8",
            weight_dtype="fp8", policy="hbm=s3fifo,dram=lru-k",
            policy_params="s3fifo.small_size_ratio=0.2,lru-k.k=3",
            enable_prefix_caching=True, num_gpu_blocks=2000, coalesce_decode=False,
            tiers="hbm,dram,nvme", tier_capacity="dram=256GiB,nvme=2TB",
            write_policy="write-back", hierarchy="exclusive", admission="nvme=second-chance",
            prefetch=False, prefetch_lead_s=0.25, load_overlap="layerwise", rope_reuse=True,
            timeline_interval_s=0.5, compression="quant:k=8,v=8", auto_latency_budget_s=0.04,
            auto_memory_fraction=0.1, seed=7, replicas=4, router="llm-d",
            router_params="llm-d.prefix_weight=3,llm-d.approximate=true",
            router_refresh_s=0.01, pd="", pd_threshold=64,
        ),
    )  # fmt: skip


def config_seeds() -> list[dict]:
    from kvsim.config import RunConfig
    from kvsim.engine.config import EngineConfig

    base = RunConfig().as_dict()
    busy = RunConfig(
        trace="mooncake-arxiv-1000", max_requests=50, rate=2.0, arrival="gamma", cv=2.0,
        model="qwen2.5-0.5b", hardware="h200-sxm", slo_ttft_s=1.0, slo_tpot_s=0.05,
        engine=EngineConfig(policy="hbm=lru,dram=arc", tiers="hbm,dram", replicas=2,
                            router="round-robin", pd="1:1", tier_capacity="dram=1TiB",
                            num_gpu_blocks=4000),
    ).as_dict()  # fmt: skip
    auto = RunConfig(
        trace="agentic", rate=0.5, arrival="poisson", model="llama-3.1-8b",
        engine=EngineConfig(compression="auto:none|h2o:budget=0.3", auto_latency_budget_s=0.02,
                            router="dynamo-kv", replicas=3,
                            router_params="dynamo-kv.overlap_score_weight=2"),
    ).as_dict()  # fmt: skip
    return [_no_nulls(d) for d in (base, busy, auto, full_config().as_dict())]


def _no_nulls(doc: Any) -> Any:
    """A config tree without its None values (TOML has no null; a missing key is its default)."""
    if isinstance(doc, dict):
        return {k: _no_nulls(v) for k, v in doc.items() if v is not None}
    return doc


def _config_keys() -> list[str]:
    from kvsim.engine.config import EngineConfig

    keys = {k for table in full_config().as_dict().values() for k in table}
    keys |= {f.name for f in dataclasses.fields(EngineConfig)}
    return ["trace", "model", "hardware", "engine", "slo", *sorted(keys)]


CONFIG_KEYS = _config_keys()


def run_config(path: Path, opts: dict[str, Any]) -> None:
    """What `kvsim run --config FILE` does before simulating: read, then `resolve` (the one
    validator); the resolved config, as the run writes it, must read back and resolve again."""
    from kvsim.config import RunConfig
    from kvsim.resolve import resolve

    resolved = resolve(RunConfig.from_toml(path)).config
    check_written_config(resolved, path.with_name("again.toml"))


def check_written_config(config: Any, path: Path) -> None:
    """A config a run records beside its results replays: it reads back equal and resolves."""
    from kvsim import tomlwrite
    from kvsim.config import RunConfig
    from kvsim.errors import KvsimError
    from kvsim.resolve import resolve

    path.write_text(tomlwrite.dumps(config.as_dict()))
    try:
        again = RunConfig.from_toml(path)
        resolve(again)
    except KvsimError as exc:
        raise BadOutput(f"the config a run writes is refused on replay: {exc}") from None
    if repr(again) != repr(config):
        raise BadOutput(f"config read back from its own resolved TOML differs: {again!r}")


# --- run settings written as text: sweep specs, plan and run options, compression, parameters ----


def text_input(path: Path) -> str:
    """An input file's text as a command line would hand it over (bad bytes escaped)."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def text_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def text_of(value: Any) -> str:
    """Any mutated leaf as the text a user could type."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    with contextlib.suppress(TypeError, ValueError):
        return json.dumps(value)
    return str(value)


def scalar_text() -> st.SearchStrategy:
    """Leaves of text settings: numbers and words as text, and edge values."""
    return st.one_of(
        st.sampled_from(EDGE_TEXT),
        st.sampled_from(EDGE_INTS).map(str),
        st.sampled_from(EDGE_FLOATS).map(repr),
        st.integers().map(str),
        st.floats().map(repr),
        st.text(max_size=12),
    )


def text_target(name: str, what: str, seeds: Callable[[], list[Any]], keys: list[str],
                render: Callable[[Any], str], run: Callable[[Path, dict[str, Any]], None],
                prepare: Callable[[Path], None] = lambda work: None) -> Target:  # fmt: skip
    """A setting typed as one string: a structured seed mutated, rendered, its bytes damaged."""
    cache: list[list[Any]] = []

    def make(data: st.DataObject):
        if not cache:
            cache.append(seeds())
        doc = mutate_many(data, data.draw(st.sampled_from(cache[0])), scalar_text(), keys)
        raw = text_bytes(render(doc))
        if data.draw(st.integers(0, 3)) == 0:
            raw = mutate_bytes(data, raw)
        return raw, "setting.txt", {}

    return Target(name, what, make, run, prepare)


#: Files the compression seeds name (moe-nd table= and sensitivity=), written by `prepare`.
_FILES: dict[str, str] = {}


def compression_seeds() -> list[Any]:
    """Every profile with every key: its default, or a typical value when it has none."""
    from kvsim.compression import PROFILES
    from kvsim.compression.base import value_text

    typical = {"int": "8", "count": "64", "bits": "4", "ratio": "0.5", "amount": "0.1",
               "ratios": "0.5/0.25", "layers": "0.5x4x4*12/1x16x16*12"}  # fmt: skip
    docs: list[Any] = []
    for name, cls in PROFILES.items():
        values = {k: value_text(key.kind, key.default) if key.default is not None
                  else typical.get(key.kind, "") for k, key in cls.keys.items()}  # fmt: skip
        if name == "moe-nd":  # one source at a time, each with the keys it takes
            docs += [{"name": name, "keys": {"budget": "0.5", "n_layers": "24", "group": "64"}},
                     {"name": name, "keys": {"budget": "0.4",
                                             "sensitivity": _FILES["sensitivity"]}},
                     {"name": name, "keys": {"table": _FILES["table"]}},
                     {"name": name, "keys": {"layers": values["layers"]}}]  # fmt: skip
        elif name == "auto":
            docs.append(
                {
                    "name": name,
                    "candidates": [
                        {"name": "none", "keys": {}},
                        {"name": "h2o", "keys": {"budget": "0.3"}},
                        {"name": "quant", "keys": {"k": "2"}},
                    ],
                }
            )
        else:
            docs.append({"name": name, "keys": values})
    return docs


def compression_text(doc: Any) -> str:
    """NAME[:key=value,...], auto's candidates joined by '|'; any mutated tree renders."""
    if isinstance(doc, list):
        return ",".join(compression_text(d) for d in doc)
    if not isinstance(doc, dict):
        return text_of(doc)
    name = text_of(doc.get("name", ""))
    if "candidates" in doc:
        rest = "|".join(compression_text(c) for c in as_rows(doc["candidates"]))
    else:
        keys = doc.get("keys", {})
        rest = (",".join(f"{text_of(k)}={text_of(v)}" for k, v in keys.items())
                if isinstance(keys, dict) else text_of(keys))  # fmt: skip
    return f"{name}:{rest}" if rest else name


def prepare_compression(work: Path) -> None:
    table = work / "layers.csv"
    table.write_text("layer,keep,kbits,vbits\n0,0.5,4,4\n")  # one entry: every layer
    sens = work / "sensitivity.csv"
    rows = [f"{layer},{keep},{bits},{bits},{loss}" for layer in range(24)
            for keep, bits, loss in (("1.0", 16, 0.0), ("0.5", 4, 0.01 * (layer + 1)))]  # fmt: skip
    sens.write_text("layer,keep,kbits,vbits,loss\n" + "\n".join(rows) + "\n")
    _FILES.update(table=str(table), sensitivity=str(sens))


COMPRESSION_KEYS = ["name", "keys", "candidates", "sinks", "window", "budget", "recent",
                    "capacity", "ratio", "k", "v", "group", "residual", "table", "sensitivity",
                    "n_layers", "layers", "partial", "none", "quant", "h2o", "snapkv", "lkv",
                    "kvp", "moe-nd", "infinigen", "streaming", "auto"]  # fmt: skip


def run_compression(path: Path, opts: dict[str, Any]) -> None:
    """`--compression TEXT`: the profile parsed, its canonical label read back to the same
    profile (runs record the label), then resolved for a run on three kinds of model (full
    attention; sliding and global; MLA)."""
    from kvsim.compression import parse_compression
    from kvsim.config import RunConfig
    from kvsim.engine.config import EngineConfig
    from kvsim.resolve import resolve

    text = text_input(path)
    comp = parse_compression(text)
    if parse_compression(comp.label) != comp:
        raise BadOutput(f"label {comp.label!r} does not read back as the same profile")
    for n in (0, 1, 100, 5000):
        kept = comp.kept_tokens(n)
        if not (isinstance(kept, int) and 0 <= kept <= n):
            raise BadOutput(f"{comp.label}: keeps {kept!r} of {n} tokens")
    for model, tp in (("qwen2.5-0.5b", 1), ("gemma-2-27b", 1), ("deepseek-v3", 8)):
        engine = EngineConfig(compression=text, tp=tp)
        config = RunConfig(model=model, hardware="h200-sxm", engine=engine)
        check_written_config(resolve(config).config, path.with_name("again.toml"))


def params_seeds(kind: str) -> list[Any]:
    """Every built-in plugin of `kind` that takes parameters, with each at its default."""
    from kvsim.policies import _REGISTRY as policies
    from kvsim.routers import _REGISTRY as routers

    registry = policies if kind == "policy" else routers
    docs = []
    for name, cls in registry.builtins.items():
        if cls.Params is None:
            continue
        values = {f.name: f.default for f in dataclasses.fields(cls.Params)
                  if f.default is not dataclasses.MISSING}  # fmt: skip
        docs.append({name: {k: list(v) if isinstance(v, tuple) else v
                            for k, v in values.items()}})  # fmt: skip
    plugin = {"policy": "kvsim.policies.lru:LRU"}.get(kind, "kvsim.routers.round_robin:RoundRobin")
    docs.append({plugin: {"x": 1}})  # a module:Class plugin (takes no parameters)
    return [docs[i] | docs[(i + 3) % len(docs)] if i % 2 else docs[i] for i in range(len(docs))]


def params_text(doc: Any) -> str:
    """'plugin.key=value,...' with JSON values (text left bare half the time, as typed)."""
    if not isinstance(doc, dict):
        return text_of(doc)
    items = []
    for plugin, values in doc.items():
        if not isinstance(values, dict):
            items.append(f"{text_of(plugin)}={text_of(values)}")
            continue
        for key, value in values.items():
            shown = value if isinstance(value, str) and len(value) % 2 else text_of(value)
            if isinstance(value, float) and not math.isfinite(value):
                shown = text_of(value)
            items.append(f"{text_of(plugin)}.{text_of(key)}={shown}")
    return ",".join(items)


#: `module:Class` plugin names the fuzzer may import: importing an arbitrary module it made up
#: could run anything (`antigravity` opens a browser), so other names are left out.
SAFE_MODULES = ("kvsim.policies.lru", "kvsim.policies", "kvsim.routers.round_robin",
                "kvsim.routers", "json", "kvsim_no_such_module")  # fmt: skip


def _safe_name(name: str) -> bool:
    return ":" not in name or name.partition(":")[0] in SAFE_MODULES


def run_policy_params(path: Path, opts: dict[str, Any]) -> None:
    """`--policy-param`: parsed, each policy built from its parameters, then used on a tier."""
    from kvsim.policies import make_policy, parse_policy_params
    from kvsim.policies.base import BlockInfo

    for name, params in parse_policy_params(text_input(path)).items():
        if not _safe_name(name):
            continue
        policy = make_policy(name, params)
        policy.set_capacity(16)
        live: set[int] = set()
        for key in range(24):
            info = BlockInfo(now_s=key * 0.5, position=key % 5, parent=key - 1, kind="user",
                             size_bytes=4096, recompute_s=1e-3, next_use=key + 7.0,
                             request_tokens=64)  # fmt: skip
            policy.miss(key, info)
            policy.add(key, info)
            live.add(key)
            if key % 3 == 0:
                policy.access(key, info)
            if len(live) > 16:
                victim = policy.victim()
                if victim not in live:
                    raise BadOutput(f"policy {name}: victim {victim!r} is not evictable")
                policy.discard(victim)
                policy.forget(victim)
                live.discard(victim)


def run_router_params(path: Path, opts: dict[str, Any]) -> None:
    """`--router-param`: parsed, checked as `resolve` checks them, and each router built."""
    from kvsim.routers import check_router_params, make_router, parse_router_params

    for name, params in parse_router_params(text_input(path)).items():
        if not _safe_name(name):
            continue
        check_router_params(name, params)
        make_router(name, params)


ROUTER_KEYS = ["dynamo-kv", "llm-d", "session", "sglang-cache-aware", "production-stack",
               "round-robin", "overlap_score_weight", "ttl_s", "prefix_weight",
               "pd_threshold_tokens", "virtual_nodes", "max_tree_size", "mode", "beta",
               "max_trie_blocks", "lru_capacity_blocks", "temperature"]  # fmt: skip
POLICY_KEYS = ["s3fifo", "2q", "lru-k", "lmcache-cost", "bayes-reuse", "ema-head", "asym-cost",
               "lru", "k", "small_size_ratio", "ghost_size_ratio", "sample", "seed",
               "horizon_s", "depth_edges", "age_bins", "gap_edges", "kind_map", "head_groups",
               "prior", "refresh_every"]  # fmt: skip


# --- sweep specs ----------------------------------------------------------------------------------


def sweep_seeds() -> list[dict]:
    """Specs with every section: flat keys, the config file's tables, per-tier sizes."""
    full = _no_nulls(full_config().as_dict())
    full["trace"]["max_requests"] = 5
    del full["engine"]["weight_dtype"]  # a spec gives the run's, model.weight_dtype
    return [
        {"base": {"trace": "mooncake-conversation", "max_requests": 20, "model": "qwen2.5-0.5b",
                  "engine": {"tiers": "hbm,dram"}},
         "grid": {"policy": ["lru", "s3fifo"], "replicas": [1, 2],
                  "tier_capacity": {"dram": ["256GiB", "1TiB"]}},
         "zip": {"rate_scale": [1.0, 2.0], "seed": [0, 1]}},
        {"base": full, "configs": [{"router": "round-robin"},
                                   {"router": "dynamo-kv", "pd": "1:1", "replicas": 2,
                                    "compression": "none"}]},
        {"base": {"trace.name": "sharegpt", "slo.ttft_s": 1.0, "hardware.profile": "h100-sxm",
                  "max_requests": 10},
         "list": [{"compression": "h2o:budget=0.2"}, {"compression": "quant:k=4,v=4"},
                  {"tier_capacity.dram": "64GiB", "tiers": "hbm,dram"}]},
        {"base": {"max_requests": 3}},
    ]  # fmt: skip


SWEEP_KEYS = ["base", "grid", "zip", "list", "configs", "tier_capacity", "tier_capacity.dram",
              "trace.name", "engine.policy", *CONFIG_KEYS]  # fmt: skip


def run_sweep(path: Path, opts: dict[str, Any]) -> None:
    """`kvsim sweep SPEC`: read and expand the spec, checking every configuration; the first
    few configurations' configs, as each run writes them, must replay."""
    from kvsim.resolve import resolve
    from kvsim.sweep.spec import load_spec

    configurations = load_spec(path)
    if not configurations:
        raise BadOutput("a spec expanded to no configurations without an error")
    for configuration in configurations[:3]:
        resolved = resolve(configuration.config).config  # as the sweep's worker runs it
        check_written_config(resolved, path.with_name("again.toml"))


# --- command lines: kvsim plan and kvsim run, in process ----------------------------------------


class Reached(Exception):
    """The plan's search was reached: every argument was accepted."""


def cli_target(name: str, what: str, seeds: Callable[[], list[list[list[str]]]],
               options: Callable[[], list[str]], tail: Callable[[st.DataObject], list[str]],
               run: Callable[[Path, dict[str, Any]], None],
               prepare: Callable[[Path], None]) -> Target:  # fmt: skip
    """A command line as [option, value] pairs: values changed, options dropped, added (any of
    the command's, with edge values) and repeated; `tail` bounds the run (always last)."""
    cache: list[Any] = []

    def make(data: st.DataObject):
        if not cache:
            cache.append((seeds(), options()))
        lines, known = cache[0]
        pairs = mutate_many(data, data.draw(st.sampled_from(lines)), scalar_text(), known)
        argv = []
        for pair in as_rows(pairs):
            argv += [text_of(p) for p in pair] if isinstance(pair, list) else [text_of(pair)]
        for _ in range(data.draw(st.integers(0, 2))):
            argv += [data.draw(st.sampled_from(known)), data.draw(scalar_text())]
        return text_bytes(json.dumps(argv + tail(data))), "argv.json", {}

    return Target(name, what, make, run, prepare)


def run_cli(argv: list[str]) -> None:
    """`kvsim ARGV` through `kvsim.cli.main`: exit 0, or exit 2 with one `kvsim: error:` line
    (stderr's last); anything else escapes main and is a crasher."""
    from kvsim.cli import main
    from kvsim.errors import KvsimError

    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    lines = err.getvalue().rstrip("\n").split("\n")
    if code == 2:
        if not lines[-1].startswith("kvsim: error: ") or "Traceback" in err.getvalue():
            raise BadOutput(f"exit 2 without a one-line error at the end: {err.getvalue()!r:.300}")
        raise KvsimError(lines[-1])  # refused, in one line: counted as such
    if code != 0:
        raise BadOutput(f"exit {code}: {err.getvalue()!r:.300}")


def plan_seeds() -> list[list[list[str]]]:
    common = [["--slo-ttft-p99", "2"], ["--slo-tpot-p99", "0.1"], ["--rates", "1x,2x"]]
    return [
        [["--trace", "mooncake-conversation"], *common],
        [["--trace", "sharegpt"], ["--model", "qwen2.5-0.5b"], ["--hardware", "h200-sxm"],
         ["--tp", "2"], ["--slo-ttft-p99", "0.5"], ["--slo-tpot-p99", "0.05"],
         ["--rates", "1x,3/s,0.5x"], ["--routers", "round-robin,llm-d,dynamo-kv"],
         ["--max-replicas", "8"], ["--min-gain", "0.05"], ["--seed", "3"], ["--json"],
         ["--out", "plan-out"]],
        [["--trace", "agentic"], *common, ["--routers", "session"], ["--executor", "serial"],
         ["-j", "1"], ["--quiet"]],
    ]  # fmt: skip


def _command_options(name: str) -> Callable[[], list[str]]:
    def options() -> list[str]:
        from kvsim.cli import cli

        return [opt for p in cli.commands[name].params for opt in p.opts if opt != "--help"]

    return options


def plan_tail(data: st.DataObject) -> list[str]:
    """Always a small --max-requests (the trace is loaded to learn its rate)."""
    return ["--max-requests", str(data.draw(st.sampled_from([5, 20, 60])))]


def prepare_plan(work: Path) -> None:
    """Work in `work` (relative --out names land there); the plan's search is replaced by the
    contract check: every run the plan may make, checked up front, must resolve."""
    import kvsim.plan.cli as plan_cli

    os.chdir(work)

    def search(settings, resolved, executor, jobs, ray_address, quiet):
        from kvsim.errors import KvsimError
        from kvsim.plan import Deployment
        from kvsim.resolve import resolve

        for rate in resolved:
            for router in settings.routers:
                for replicas in sorted({1, settings.max_replicas}):
                    config = settings.config(rate, Deployment(replicas, router))
                    try:
                        resolve(config)
                    except KvsimError as exc:
                        raise BadOutput(
                            f"plan checked its settings, then a run it may make is refused: {exc}"
                        ) from None
        raise Reached

    plan_cli._search = search


def run_plan_cli(path: Path, opts: dict[str, Any]) -> None:
    with contextlib.suppress(Reached):
        run_cli(["plan", *json.loads(path.read_text())])
    shutil.rmtree(path.with_name("plan-out"), ignore_errors=True)


def run_seeds() -> list[list[list[str]]]:
    return [
        [["--trace", "sharegpt"], ["--model", "qwen2.5-0.5b"]],
        [["--trace", "agentic"], ["--model", "qwen2.5-0.5b"], ["--replicas", "3"],
         ["--router", "llm-d"], ["--router-param", "llm-d.prefix_weight=3"],
         ["--compression", "h2o:budget=0.3"], ["--tiers", "hbm,dram"],
         ["--tier", "dram=64GiB"], ["--policy", "hbm=lru,dram=s3fifo"],
         ["--policy-param", "s3fifo.small_size_ratio=0.2"], ["--router-refresh-s", "0.05"]],
        [["--trace", "mooncake-conversation"], ["--model", "qwen2.5-0.5b"], ["--pd", "1:1"],
         ["--router", "dynamo-kv"], ["--pd-threshold", "100"], ["--hardware", "h200-sxm"],
         ["--block-size", "32"], ["--num-gpu-blocks", "3000"], ["--kv-dtype", "fp8"],
         ["--slo-ttft", "1"], ["--slo-tpot", "0.05"], ["--json"]],
        [["--trace", "pi-coding-agent"], ["--model", "llama-3.2-1b"], ["--compression", "auto"],
         ["--auto-latency-budget", "0.02"], ["--auto-memory-fraction", "0.2"],
         ["--max-num-seqs", "8"], ["--max-batched-tokens", "1024"], ["--no-chunked-prefill"],
         ["--kv-reservation", "full"], ["--num-scheduler-steps", "2"], ["--rope-reuse"],
         ["--load-overlap", "layerwise"], ["--timeline-interval", "0.1"], ["--seed", "4"]],
        [["--config", "busy.toml"], ["--rate", "3"], ["--arrival", "gamma"], ["--cv", "3"],
         ["--baseline", "fifo"], ["--write-policy", "write-through"],
         ["--hierarchy", "exclusive"], ["--admission", "second-chance"], ["--no-prefetch"]],
    ]  # fmt: skip


def run_tail(data: st.DataObject) -> list[str]:
    """Always a small --max-requests, and a fresh results folder."""
    n = data.draw(st.sampled_from([1, 2, 3, 5]))
    return ["--max-requests", str(n), "--out", "run-out", "--overwrite"]


def prepare_run(work: Path) -> None:
    """Work in `work` (results and relative names land there); a config for --config."""
    from kvsim import tomlwrite

    os.chdir(work)
    busy = config_seeds()[1]
    busy["trace"]["max_requests"] = 5
    (work / "busy.toml").write_text(tomlwrite.dumps(busy))


def run_run_cli(path: Path, opts: dict[str, Any]) -> None:
    try:
        run_cli(["run", *json.loads(path.read_text())])
    finally:
        for folder in ("run-out", "run-out-baseline", "runs"):
            shutil.rmtree(path.with_name(folder), ignore_errors=True)


def targets() -> dict[str, Target]:
    found = [
        jsonl_target("mooncake", "mooncake", mooncake_seeds, MOONCAKE_KEYS),
        sharegpt_target(),
        lmsys_target(),
        csv_target("azure", "azure", azure_seeds),
        csv_target("burstgpt", "burstgpt", burstgpt_seeds),
        jsonl_target("dynamo", "dynamo", dynamo_seeds, DYNAMO_KEYS),
        swe_agent_target(),
        servegen_target(),
        canonical_target(),
        jsonl_target("jsonl", "jsonl", kvsim_jsonl_seeds, JSONL_KEYS),
        toml_target("profile", "hardware profile TOML", profile_seeds, PROFILE_KEYS, run_profile),
        toml_target("model", "model TOML (kvsim size)", model_seeds, MODEL_KEYS, run_model),
        toml_target("config", "run config TOML, every key (kvsim run --config)", config_seeds,
                    CONFIG_KEYS, run_config),
        toml_target("sweep", "sweep spec TOML (kvsim sweep)", sweep_seeds, SWEEP_KEYS, run_sweep),
        cli_target("plan", "kvsim plan options, up to the search", plan_seeds,
                   _command_options("plan"), plan_tail, run_plan_cli, prepare_plan),
        text_target("compression", "--compression profile text", compression_seeds,
                    COMPRESSION_KEYS, compression_text, run_compression, prepare_compression),
        text_target("router-params", "--router-param text", lambda: params_seeds("router"),
                    ROUTER_KEYS, params_text, run_router_params),
        text_target("policy-params", "--policy-param text", lambda: params_seeds("policy"),
                    POLICY_KEYS, params_text, run_policy_params),
        cli_target("run", "kvsim run options, end to end (--max-requests <= 5)", run_seeds,
                   _command_options("run"), run_tail, run_run_cli, prepare_run),
    ]  # fmt: skip
    return {t.name: t for t in found}


# --- one target, in its own process ---------------------------------------------------------------


class Hang(Exception):
    """One input ran past `--hang-s`."""


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    def ring(signum, frame):
        raise Hang(f"no answer after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def signature(exc: BaseException) -> str:
    """Type and the innermost kvsim frame: one entry per distinct bug, not per input."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}kvsim{os.sep}" in f.filename]
    where = ours[-1] if ours else (frames[-1] if frames else None)
    place = f"{Path(where.filename).name}:{where.lineno}" if where else "?"
    return f"{type(exc).__name__} at {place}"


def fuzz_one(target: Target, seconds: float, seed: int, save: Path, hang_s: float) -> dict:
    from kvsim.errors import KvsimError

    shm = Path("/dev/shm")  # memory: a file per input costs microseconds there, ms on disk
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix=f"kvsim-fuzz-{target.name}-", dir=where))
    print(f"WORK {work}", flush=True)  # the driver keeps the last input if this process dies
    target.prepare(work)
    folder = save / target.name  # this run's crashers only
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    current = work / "current-input.json"
    stop_at = time.monotonic() + seconds
    unraisable: list[Any] = []
    sys.unraisablehook = unraisable.append
    tried = accepted = 0
    crashers: dict[str, dict[str, str]] = {}

    def fuzz(data: st.DataObject) -> None:
        nonlocal tried, accepted
        raw, name, opts = target.make(data)
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        current.write_text(json.dumps({"file": name, "options": opts, "bytes": raw.hex()}))
        unraisable.clear()
        try:
            with alarm(hang_s), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                target.run(path, opts)
            accepted += 1
        except KvsimError as exc:
            if "\n" in str(exc):
                key = f"multi-line {type(exc).__name__}"
                record(BadOutput(f"multi-line error: {exc!r}"), raw, name, opts, key)
        except Exception as exc:  # every other exception is what we look for
            record(exc, raw, name, opts)
        else:
            for w in caught:  # NaN or overflow arithmetic on the input, printed on stderr
                if issubclass(w.category, RuntimeWarning):
                    key = f"RuntimeWarning at {Path(w.filename).name}:{w.lineno}"
                    record(BadOutput(f"{key}: {w.message}"), raw, name, opts, key)
        for hook in unraisable:  # a traceback printed on stderr ("Exception ignored in ...")
            key = f"traceback on stderr: {type(hook.exc_value).__name__}"
            record(BadOutput(f"{key}: {hook.exc_value!r}"), raw, name, opts, key)
        tried += 1

    def record(
        exc: BaseException, raw: bytes, name: str, opts: dict[str, Any], key: str = ""
    ) -> None:
        key = key or signature(exc)
        if key in crashers:
            crashers[key]["count"] = str(int(crashers[key]["count"]) + 1)
            return
        stem = save / target.name / f"crash-{len(crashers) + 1}"
        (stem.parent / (stem.name + "-" + name.replace("/", "_"))).write_bytes(raw)
        text = "".join(traceback.format_exception(exc))
        (stem.parent / (stem.name + ".txt")).write_text(
            f"target: {target.name}\nfile: {name}\noptions: {opts!r}\n\n{text}"
        )
        crashers[key] = {
            "count": "1",
            "message": f"{type(exc).__name__}: {exc}"[:300],
            "input": str(stem.parent / (stem.name + "-" + name.replace("/", "_"))),
        }
        print(f"[{target.name}] crasher {key}: {crashers[key]['message']}", file=sys.stderr)

    # Batches of examples, each a fresh hypothesis run with its own seed, sized to about a
    # second so the budget is kept without stopping hypothesis mid-run.
    rounds, batch = 0, 10
    while time.monotonic() < stop_at:
        before, start = tried, time.monotonic()
        run = settings(max_examples=batch, deadline=None, database=None, phases=[Phase.generate],
                       suppress_health_check=list(HealthCheck))(given(st.data())(fuzz))  # fmt: skip
        hypothesis_seed(seed * 100_000 + rounds)(run)()
        rounds += 1
        rate = (tried - before) / max(time.monotonic() - start, 1e-3)
        batch = int(min(max(rate * min(1.0, stop_at - time.monotonic()), 1), 5000))
    shutil.rmtree(work, ignore_errors=True)
    return {"target": target.name, "what": target.what, "tried": tried, "accepted": accepted,
            "seconds": seconds, "crashers": crashers}  # fmt: skip


# --- driver ---------------------------------------------------------------------------------------


def run_child(name: str, args: argparse.Namespace) -> dict:
    """One target in a fresh process: a crash or runaway allocation stays in it."""
    command = [sys.executable, __file__, "--child", name, "--seconds", str(args.seconds),
               "--seed", str(args.seed), "--save", str(args.save), "--hang-s", str(args.hang_s),
               "--mem-gib", str(args.mem_gib)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 300)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        work = [line[5:] for line in out.splitlines() if line.startswith("WORK ")]
        why = "the fuzzing process stopped answering (killed)"
        return _died(name, args, why, Path(work[0]) if work else None)
    sys.stderr.write(done.stderr[-4000:] if done.returncode else done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        work = [line[5:] for line in done.stdout.splitlines() if line.startswith("WORK ")]
        why = f"the fuzzing process died (exit {done.returncode})"
        return _died(name, args, why, Path(work[0]) if work else None)
    return json.loads(lines[-1])


def _died(name: str, args: argparse.Namespace, why: str, work: Path | None = None) -> dict:
    kept = Path(args.save) / name / "died-input.json"
    if work is not None and (work / "current-input.json").exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(work / "current-input.json", kept)
        shutil.rmtree(work, ignore_errors=True)
    crash = {"count": "1", "message": why, "input": str(kept)}
    return {"target": name, "what": "", "tried": -1, "accepted": -1, "seconds": args.seconds,
            "crashers": {"process died": crash}}  # fmt: skip


def table(results: list[dict]) -> str:
    lines = ["| target | input | inputs tried | inputs/s | accepted | distinct crashers |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        rate = r["tried"] / r["seconds"] if r["tried"] >= 0 else 0
        tried = f"{r['tried']:,}" if r["tried"] >= 0 else "?"
        share = f"{r['accepted'] / r['tried']:.0%}" if r["tried"] > 0 else "?"
        lines.append(f"| {r['target']} | {r['what']} | {tried} | {rate:,.0f} | {share} | "
                     f"{len(r['crashers'])} |")  # fmt: skip
    total = sum(max(r["tried"], 0) for r in results)
    lines.append(f"| **all** | | **{total:,}** | | | "
                 f"**{sum(len(r['crashers']) for r in results)}** |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="wall time per target")
    parser.add_argument("--only", help="comma-separated targets (default: all)")
    parser.add_argument("--save", help="folder for crashing inputs (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    parser.add_argument("--hang-s", type=float, default=10.0, help="one input's time limit")
    parser.add_argument("--mem-gib", type=float, default=3.0, help="address space per target")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.save = Path(args.save or tempfile.mkdtemp(prefix="kvsim-fuzz-crashers-")).resolve()
    known = targets()
    if args.child:
        limit = int(args.mem_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        result = fuzz_one(known[args.child], args.seconds, args.seed, args.save, args.hang_s)
        print(json.dumps(result))
        return
    names = args.only.split(",") if args.only else list(known)
    for name in names:
        if name not in known:
            parser.error(f"unknown target {name!r}; valid: {', '.join(known)}")
    results = []
    for name in names:
        print(f"fuzzing {name} for {args.seconds:g} s ...", file=sys.stderr, flush=True)
        results.append(run_child(name, args))
        r = results[-1]
        print(f"  {r['tried']:,} inputs, {len(r['crashers'])} crashers", file=sys.stderr)
    print(table(results))
    for r in results:
        for key, crash in r["crashers"].items():
            print(
                f"- {r['target']}: {key} (x{crash['count']}): {crash['message']}\n"
                f"  input: {crash['input']}"
            )
    print(f"crashing inputs and tracebacks: {args.save}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()

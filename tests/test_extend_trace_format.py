"""Trace formats behind a registry: the worked example in examples/extend/ runs and says what it
says, and the registry refuses duplicates, lists valid names on a miss and finds plugins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import kvsim.plugins
from kvsim.errors import PluginError, TraceError, UnknownNameError
from kvsim.traces import formats
from kvsim.traces.formats import Head, ReadOptions, TraceFormat, detect_format, get_format
from kvsim.traces.registry import load_trace
from kvsim.traces.schema import Trace

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "extend" / "trace_format.py"
BUILTINS = ["canonical", "jsonl", "mooncake", "sharegpt", "lmsys", "azure", "burstgpt", "dynamo",
            "swe-agent", "qwen-bailian"]  # fmt: skip


def test_the_worked_example_runs_and_prints_what_it_shows():
    # In a process of its own: the example registers a format, which must not leak into others.
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "detected format: reqlog",
        "tiny: 3 requests; reqlog tiny.reqlog: real arrivals and lengths, one shared system prompt",
        " request_id  session_id  turn  arrival_s  input_tokens",
        "          0           0     0        0.0           840",
        "          1           1     0        0.5           825",
        "          2           0     1        2.0           860",
        "rate_scale=2, max_requests=2: arrivals [0.0, 0.25]",
    ]


def test_builtin_formats_in_their_order():
    assert formats.builtin_format_names() == BUILTINS
    for name in BUILTINS:
        reader = get_format(name)
        assert isinstance(reader, TraceFormat) and reader.name == name


def test_a_name_registered_twice_is_a_bug():
    class Again(TraceFormat):
        name = "jsonl"

    with pytest.raises(ValueError, match="registered twice"):
        formats.register(Again)


def test_an_unknown_format_lists_the_valid_ones(tmp_path):
    with pytest.raises(UnknownNameError, match=r"unknown trace format 'nope'; valid: azure, "):
        get_format("nope")
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 0, "output_tokens": 2, "segments": [[1, 5]]}\n')
    with pytest.raises(UnknownNameError, match="swe-agent"):
        load_trace(path, format="nope")
    with pytest.raises(UnknownNameError):  # not an import path, as policies take
        load_trace(path, format="os:path")


def test_a_file_no_format_takes_lists_every_format(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello")
    with pytest.raises(TraceError) as info:
        detect_format(path)
    assert str(info.value) == f"{path}: unknown trace format; pass a format ({', '.join(BUILTINS)})"


class _Pointer(TraceFormat):
    """A plugin's format: a `.jsonl` file whose one row, {"see": NAME}, names a Mooncake file
    beside it to read instead."""

    name = "plugin-pointer"
    suffixes = (".jsonl",)

    def sniff(self, path: Path, head: Head) -> bool:
        return isinstance(head.first_json, dict) and "see" in head.first_json

    def open(self, path: Path, options: ReadOptions) -> Trace:
        target = path.with_name(json.loads(path.read_text())["see"])
        return get_format("mooncake").open(target, options)


def _entry_points(monkeypatch, **loaders):
    points = [SimpleNamespace(name=name, load=load) for name, load in loaders.items()]
    monkeypatch.setattr(kvsim.plugins, "entry_points", lambda group: points)


def test_a_plugin_format_is_named_detected_and_loaded(monkeypatch, tmp_path):
    _entry_points(monkeypatch, **{"plugin-pointer": lambda: _Pointer})
    row = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
    (tmp_path / "m.jsonl").write_text(row)
    path = tmp_path / "p.jsonl"
    path.write_text('{"see": "m.jsonl"}\n')
    assert formats.format_names() == [*BUILTINS, "plugin-pointer"]
    assert detect_format(path) == "plugin-pointer"  # asked before the catch-all (mooncake)
    assert detect_format(tmp_path / "m.jsonl") == "mooncake"
    assert len(load_trace(path)) == 1
    with pytest.raises(UnknownNameError, match="plugin-pointer"):
        get_format("nope")


def test_a_broken_plugin_is_one_line(monkeypatch):
    def broken():
        raise ImportError("no module named 'gone'")

    _entry_points(monkeypatch, gone=broken)
    with pytest.raises(PluginError, match="trace format 'gone': cannot load its entry point"):
        get_format("gone")

"""Compression profiles behind a registry (issue 21): the worked example in examples/extend/ runs
and says what it says; the registry refuses duplicates, lists valid names on a miss and finds
plugins; callers ask a profile what it does instead of comparing its name."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

import kvsim.plugins
from kvsim.compression import (
    PROFILES,
    Compression,
    Key,
    bytes_per_kept_token,
    compression_work,
    parse_compression,
    profile_names,
    quality_reason,
    register,
)
from kvsim.compression.profiles import profile_class
from kvsim.errors import ConfigError, PluginError, UnknownNameError
from kvsim.models import load_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "extend" / "compression_profile.py"
BUILTINS = ["auto", "h2o", "infinigen", "kvp", "lkv", "moe-nd", "none", "quant", "snapkv",
            "streaming"]  # fmt: skip
LLAMA8 = load_model("llama-3.1-8b")


def test_the_worked_example_runs_and_prints_what_it_shows():
    # In a process of its own: the example registers a profile, which must not leak into others.
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # by hand: 32 layers x 8 heads x 2 x (128 x 4 / 8 + 4 groups x 4 B) = 40,960 B per token
    assert lines[:5] == [
        "parsed: window:bits=4,window=256 | kept of 5,000 tokens: 256",
        "bytes per kept token: 40,960",
        "KV at 100 tokens: 4,096,000 B (uncompressed 13,107,200 B)",
        "KV at 32,768 tokens: 10,485,760 B (uncompressed 4,294,967,296 B)",
        "quality: no published number found for window:bits=4,window=256: window attention is "
        "a baseline of StreamingLLM, reported as perplexity only",
    ]
    assert lines[5].split() == ["profile", "requests", "completed", "KV", "MiB", "per", "request"]
    rows = [line.split() for line in lines[6:]]
    assert [r[0] for r in rows] == ["none", "window:window=256", "window:window=256,bits=4"]
    assert all(r[1] == r[2] == "40" for r in rows)  # every request completed
    mib = [float(r[3]) for r in rows]
    assert mib[0] > mib[1] > mib[2] > 0  # a window holds less, packed tokens less again


def test_builtin_profiles_are_registered_by_name():
    assert sorted(PROFILES) == BUILTINS == profile_names()
    for name in BUILTINS:
        cls = profile_class(name)
        assert issubclass(cls, Compression) and cls.name == name and PROFILES[name] is cls


def test_a_name_registered_twice_is_a_bug():
    class Again(Compression):
        name = "h2o"

    with pytest.raises(ValueError, match="registered twice"):
        register(Again)


def test_an_unknown_profile_lists_the_valid_ones():
    with pytest.raises(UnknownNameError) as info:
        parse_compression("zip:level=9")
    assert str(info.value) == f"unknown compression profile 'zip'; valid: {', '.join(BUILTINS)}"


class _Recent(Compression):
    """A plugin's profile: the most recent `keep` tokens at the base width, and a top-k per KV
    head per prompt token (to show where a profile's own work goes)."""

    name = "plugin-recent"
    keys: ClassVar[Mapping[str, Key]] = {"keep": Key("int", 64, "Recent tokens kept.")}
    drops_tokens = True

    def keep(self, tokens, layer):
        return self.param("keep")

    def add_layer_work(self, add, layer, lb, q_heads, key_dims):
        add("select_items_per_prompt_token", lb.heads)


def _entry_points(monkeypatch, **loaders):
    points = [SimpleNamespace(name=name, load=load) for name, load in loaders.items()]
    monkeypatch.setattr(kvsim.plugins, "entry_points", lambda group: points)


def test_a_plugin_profile_is_parsed_sized_and_priced(monkeypatch):
    _entry_points(monkeypatch, **{"plugin-recent": lambda: _Recent})
    assert profile_names() == sorted([*BUILTINS, "plugin-recent"])
    comp = parse_compression("plugin-recent:keep=100")
    assert comp.label == "plugin-recent:keep=100" and comp.salt
    assert (comp.kept_tokens(5000), comp.read_tokens(5000), comp.kept_tokens(50)) == (100, 100, 50)
    assert (comp.drops, comp.linear_reads, comp.identity) == (True, False, False)
    assert bytes_per_kept_token(LLAMA8, comp) == 131_072
    assert compression_work(LLAMA8, comp).select_items_per_prompt_token == 32 * 8
    assert quality_reason(comp) == "no published number found for plugin-recent:keep=100"
    with pytest.raises(ConfigError, match="unknown key 'k'; valid keys: keep"):
        parse_compression("plugin-recent:k=1")


def test_a_broken_plugin_is_one_line(monkeypatch):
    def broken():
        raise ImportError("no module named 'gone'")

    _entry_points(monkeypatch, gone=broken)
    with pytest.raises(PluginError, match="compression profile 'gone': cannot load its entry"):
        parse_compression("gone")


def test_what_callers_ask_a_profile():
    kinds = {
        name: (c.identity, c.drops, c.linear_reads, c.prompt_only, c.offloaded,
               c.per_request_choice)
        for name, c in ((n, parse_compression(n if n != "moe-nd" else "moe-nd:budget=0.5"))
                        for n in BUILTINS)
    }  # fmt: skip
    assert kinds == {
        "none": (True, False, True, False, False, False),
        "quant": (False, False, True, False, False, False),
        "streaming": (False, True, False, False, False, False),
        "h2o": (False, True, False, False, False, False),
        "kvp": (False, True, False, False, False, False),
        "snapkv": (False, True, False, True, False, False),
        "lkv": (False, True, False, True, False, False),
        "moe-nd": (False, True, False, True, False, False),
        "infinigen": (False, False, False, False, True, False),  # every token's partial key
        "auto": (False, True, False, False, False, True),
    }
    assert parse_compression("streaming:sinks=40").exact_tokens == 40
    assert parse_compression("quant").residual_tokens() == 128
    assert parse_compression("infinigen:budget=0.5").read_tokens(1000) == 500


def test_callers_do_not_compare_profile_names():
    # every caller asks the profile (identity, drops, per_request_choice, ...), never its name
    callers = [*(ROOT / "kvsim" / "compression").glob("*.py"), ROOT / "kvsim/engine/compress.py"]
    pattern = re.compile(r"\.name\s*(==|!=|in\b|not\s+in\b)|\bname\s*==\s*\"")
    for path in callers:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{path.name}:{number}: {line.strip()}"

"""A hardware profile of one's own: the worked example in examples/extend/ runs and says what it
says, and its profile is found by path and by name, and refused when a number loses its source."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.errors import ConfigError, UnknownNameError
from kvsim.hardware import load_profile, profile_names, validate_profile

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "extend" / "hardware_profile.py"
# Writing a profile registers nothing, so the example's text can be read in this process.
X1_NODE: str = runpy.run_path(str(EXAMPLE))["X1_NODE"]


def test_the_worked_example_runs_and_prints_what_it_shows():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == [
        "x1-node: 4x X1, 64 GB at 2 TB/s, tiers ['hbm', 'dram'], 22 numbers, each with its source",
        'refused: unsourced.toml: gpu.hbm: no entry in [sources]; add "gpu.hbm" = "S<n> ..." or '
        '"assumption: ..."',
        "sharegpt, 50 requests, llama-3.1-8b: TPOT p50",
    ]
    tpot = {}
    for line in lines[3:]:
        match = re.fullmatch(r"  (\S+) +(\d+\.\d\d) ms", line)
        assert match, line
        tpot[match[1]] = float(match[2])
    assert list(tpot) == ["x1-node", "h100-sxm"]
    # decode reads the weights and the KV each step: 2 TB/s of HBM is slower than 3.35 TB/s
    assert tpot["x1-node"] > tpot["h100-sxm"] > 0


def test_every_number_has_its_source_and_an_assumption_says_so():
    sources = X1_NODE.split("[sources]\n", 1)[1].splitlines()
    assert len(sources) == 22
    assert all(re.fullmatch(r'"[\w.]+" = "assumption: [^"]+"', line) for line in sources)


def test_found_by_path_and_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("KVSIM_PROFILES", raising=False)
    path = tmp_path / "x1-node.toml"
    path.write_text(X1_NODE)
    profile = load_profile(str(path))
    assert profile == validate_profile(path)
    assert (profile.name, profile.gpus_per_node, profile.tier("hbm").capacity_bytes) == (
        "x1-node", 4, 256 * 10**9)  # fmt: skip
    with pytest.raises(UnknownNameError, match=r"unknown profile 'x1-node'; valid: .*h100-sxm"):
        load_profile("x1-node")  # not in the shipped folder
    monkeypatch.setenv("KVSIM_PROFILES", str(tmp_path))
    assert profile_names() == ["x1-node"]  # a folder of one's own replaces the shipped one
    assert load_profile("x1-node").gpu.name == "X1"


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ('hbm = "64GB"', 'hbm = "64"', r"gpu\.hbm: expected a positive size with a unit"),
        ("bf16 = 500e12", "bf16 = 500", r"gpu\.flops\.bf16: 500 FLOP/s is implausible"),
        ('capacity = "256GB"', 'capacity = "320GB"', r"tiers\.hbm\.capacity: expected gpus_per"),
        ('"tiers.dram.latency" =', "# ", r"tiers\.dram\.latency: no entry in \[sources\]"),
    ],
)
def test_a_slip_is_refused_in_one_line_naming_the_field(tmp_path, old, new, error):
    path = tmp_path / "x1-node.toml"
    assert old in X1_NODE
    path.write_text(X1_NODE.replace(old, new, 1))
    with pytest.raises(ConfigError, match=error):
        validate_profile(path)

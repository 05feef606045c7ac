"""Third-party policies: entry points, module:Class, and faults reported as the plugin's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvsim.errors import ConfigError, PluginError, UnknownNameError
from kvsim.mrc.cli import mrc
from kvsim.policies import make_policy, policy_names

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kvsim-example-policy"


@pytest.fixture(scope="module")
def installed() -> Iterator[None]:
    """pip-install the example plugin (offline, editable) into this interpreter's environment."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-e",
        str(EXAMPLE),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot install the example plugin offline: {done.stderr.strip()[-300:]}")
    # The editable install's path hook is read at interpreter start; this process needs it now.
    import importlib

    sys.path.insert(0, str(EXAMPLE))
    importlib.invalidate_caches()
    yield
    sys.path.remove(str(EXAMPLE))


def test_entry_point_plugin_runs(installed: None) -> None:
    assert "example-mru" in policy_names()
    out = CliRunner().invoke(
        mrc,
        [
            "--trace",
            "sharegpt",
            "--max-requests",
            "50",
            "--policy",
            "example-mru,lru",
            "--capacity",
            "200",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert '"policy": "example-mru"' in out.output


def test_failing_plugin_is_reported_as_its_fault(installed: None) -> None:
    out = CliRunner().invoke(
        mrc,
        [
            "--trace",
            "sharegpt",
            "--max-requests",
            "50",
            "--policy",
            "example-broken",
            "--capacity",
            "20",
            "--json",
        ],
    )
    assert isinstance(out.exception, PluginError)
    assert str(out.exception).startswith(
        "policy 'example-broken': method 'victim' raised ValueError: this plugin is broken"
    )
    assert out.output == ""  # no complete-looking output


def test_module_class_plugin() -> None:
    sys.path.insert(0, str(EXAMPLE))
    try:
        policy = make_policy("kvsim_example_policy:MRU")
    finally:
        sys.path.remove(str(EXAMPLE))
    assert policy.name == "example-mru"


def test_bad_names() -> None:
    with pytest.raises(UnknownNameError, match=r"valid: .*bayes-reuse"):
        make_policy("no-such-policy")
    with pytest.raises(ConfigError, match="unknown parameter 'nope'"):
        make_policy("bayes-reuse", {"nope": 1})
    assert make_policy("bayes-reuse", {"horizon_s": 5.0}).params.horizon_s == 5.0

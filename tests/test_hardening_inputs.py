"""Issue 25, items 2 to 4: Ctrl-C while `kvsim` starts up, implausible hardware profiles, and
requests beyond a model's context."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from helpers import Req, as_from_a_terminal, make_trace
from inputs import one_line

from kvsim.engine import EngineConfig, simulate
from kvsim.errors import ConfigError
from kvsim.hardware import load_profile, profile_names, validate_profile
from kvsim.hardware.profile import with_overrides
from kvsim.hardware.registry import profiles_dir
from kvsim.hardware.validate import PLAUSIBLE, implausible
from kvsim.models import load_model
from kvsim.models.catalog import _catalog_dir, model_names, parse_model
from kvsim.run import RunConfig, run

ROOT = Path(__file__).resolve().parents[1]
H100_TEXT = (profiles_dir() / "h100-sxm.toml").read_text()


def _kvsim_main(capsys, *args: str) -> tuple[int, str]:
    from kvsim.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


# -- 2. Ctrl-C in the first second -----------------------------------------------------------------
def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _interrupted(cmd: list[str], ready, delay_s: float, cwd: Path) -> tuple[int, list[str]]:
    """Start `cmd`, wait for a stderr line that satisfies `ready`, then `delay_s`, then send
    SIGINT; the exit code and the stderr lines after the ready one (import-time lines left
    out)."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=_env(),
        preexec_fn=as_from_a_terminal,
    )
    try:
        while True:
            line = proc.stderr.readline()
            assert line, f"{cmd} ended before it was ready"
            if ready(line):
                break
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        rest = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    lines = [x for x in rest.splitlines() if x.strip() and not x.startswith("import time:")]
    return code, lines


RUN = ["run", "--trace", "sharegpt", "--max-requests", "3000"]


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 1.0])
def test_ctrl_c_while_kvsim_imports_is_one_line_and_130(tmp_path, delay_s):
    """The console script calls `kvsim.__main__.main`; a SIGINT while it imports the command
    line (a second or more) or loads the trace ends in one line and exit code 130."""
    code = (
        "import sys\n"
        "from kvsim.__main__ import main\n"
        "sys.stderr.write('ready\\n'); sys.stderr.flush()\n"
        "main()\n"
    )
    cmd = [sys.executable, "-c", code, *RUN, "--out", str(tmp_path / "r")]
    exit_code, lines = _interrupted(cmd, lambda line: line == "ready\n", delay_s, tmp_path)
    assert exit_code == 130 and lines == ["kvsim: aborted"], lines


def _importing_click(line: str) -> bool:
    """An import-time line saying click has been imported: kvsim.cli is being imported."""
    return line.startswith("import time:") and re.search(r"\|\s*click$", line) is not None


def test_ctrl_c_while_python_m_kvsim_imports(tmp_path):
    cmd = [sys.executable, "-X", "importtime", "-m", "kvsim", *RUN, "--out", str(tmp_path / "r")]
    exit_code, lines = _interrupted(cmd, _importing_click, 0.0, ROOT)
    assert exit_code == 130 and lines == ["kvsim: aborted"], lines


def test_the_console_script_enters_through_kvsim_main(tmp_path):
    """pyproject names `kvsim.__main__:main`, whose import is cheap and whose handler wraps the
    import of `kvsim.cli`; the installed script (when it is installed) does the same."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kvsim"] == "kvsim.__main__:main"
    script = shutil.which("kvsim") or str(Path(sys.executable).with_name("kvsim"))
    if not Path(script).exists():
        pytest.skip("kvsim is not installed as a console script here")
    text = Path(script).read_text(errors="replace")
    assert "kvsim.__main__" in text, f"{script} is stale: pip install -e . to regenerate it"
    cmd = [sys.executable, "-X", "importtime", script, *RUN, "--out", str(tmp_path / "r")]
    exit_code, lines = _interrupted(cmd, _importing_click, 0.0, tmp_path)
    assert exit_code == 130 and lines == ["kvsim: aborted"], lines


# -- 3. implausible hardware -----------------------------------------------------------------------
def _write(tmp_path: Path, old: str, new: str) -> Path:
    assert old in H100_TEXT, old
    path = tmp_path / "odd.toml"
    path.write_text(H100_TEXT.replace(old, new, 1))
    return path


IMPLAUSIBLE = [
    # the two: TFLOP/s typed without e12, and a vanishing rate
    ("bf16 = 989.4e12", "bf16 = 989.4", "gpu.flops.bf16", "989.4e12"),
    ("bf16 = 989.4e12", "bf16 = 1e-9", "gpu.flops.bf16", "989.4e12"),
    ("bf16 = 989.4e12", "bf16 = 989400", "gpu.flops.bf16", "FLOP/s"),  # GFLOP/s
    ("bf16 = 989.4e12", "bf16 = 9.894e20", "gpu.flops.bf16", "FLOP/s"),
    ('hbm = "80GB"', 'hbm = "80MB"', "gpu.hbm", "bytes"),
    ('hbm_bandwidth = "3.35TB/s"', 'hbm_bandwidth = "3.35MB/s"', "gpu.hbm_bandwidth", "B"),
    ('host_link_bandwidth = "64GB/s"', 'host_link_bandwidth = "64KB/s"', "gpu.host_link", "B"),
    ("[efficiency]\n", "[efficiency]\niteration_overhead_s = 2.0\n", "iteration_overhead_s", "s"),
    ("[efficiency]\n", "[efficiency]\nrequest_overhead_s = 8.7\n", "request_overhead_s", "s"),
    ('latency = "28us"', 'latency = "28s"', "allreduce.nccl.latency", "unit"),
    ('bus_bandwidth = "352GB/s"', 'bus_bandwidth = "352B/s"', "allreduce.nccl.bus", "B"),
    ('latency = "100us"', 'latency = "100s"', "tiers.nvme.latency", "unit"),
    ('read_bandwidth = "50.4GB/s"', 'read_bandwidth = "50.4B/s"', "tiers.nvme.read", "B"),
    ('capacity = "1PB"', 'capacity = "1000000PB"', "tiers.pfs.capacity", "bytes"),
    ('transfer_overhead = "3.5us"', 'transfer_overhead = "3.5s"', "transfer_overhead", "s"),
]


@pytest.mark.parametrize(("old", "new", "field", "hint"), IMPLAUSIBLE)
def test_implausible_profile_is_refused_naming_the_field(tmp_path, old, new, field, hint):
    with pytest.raises(ConfigError) as info:
        validate_profile(_write(tmp_path, old, new))
    one_line(info, "odd.toml", field, "implausible", hint)


def test_a_run_refuses_an_implausible_profile_in_one_line(tmp_path, capsys):
    """`profile validate` and `run` both refuse it: one line, exit 2, before any simulation
    (a profile with tiny FLOPs used to make a run grow until MemoryError)."""
    path = _write(tmp_path, "bf16 = 989.4e12", "bf16 = 1e-9")
    for args in (
        ["profile", "validate", str(path)],
        ["run", "--hardware", str(path), "--max-requests", "5", "--out", str(tmp_path / "r")],
    ):
        code, err = _kvsim_main(capsys, *args)
        assert code == 2 and "gpu.flops.bf16" in err and "implausible" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_a_capacity_override_has_the_same_ceiling():
    profile = load_profile("h100-sxm")
    with pytest.raises(ConfigError) as info:
        with_overrides(profile, capacities={"dram": "1e30TB"})
    one_line(info, "dram=1e30TB", "implausible")
    assert with_overrides(profile, capacities={"dram": "4096B"}).tier("dram").capacity_bytes == 4096


def test_every_shipped_profile_and_datasheet_anchor_is_plausible():
    for name in profile_names():
        load_profile(name)  # raises on a value out of range
    anchors = {
        "flops": [65e12, 312e12, 989.4e12, 4500e12, 10e15],  # T4 fp16 .. GB200 fp4
        "memory": [16e9, 80e9, 288e9],
        "device_bandwidth": [16e9, 900e9, 3.35e12, 8e12],
        "capacity": [2e12, 30.72e12, 1e15, 7e17],
        "tier_bandwidth": [1e8, 25e9, 8e12, 6e14],
        "latency": [0.0, 1e-7, 5e-4, 0.0087],
    }
    assert set(anchors) == set(PLAUSIBLE)
    for kind, values in anchors.items():
        for value in values:
            assert implausible(kind, value) is None, (kind, value)


# -- 4. maximum context ----------------------------------------------------------------------------
PUBLISHED = {  # config.json max_position_embeddings, or the model card where they differ
    "llama-2-7b": 4096,
    "llama-3.1-8b": 131072,
    "meta-llama-3-8b": 8192,
    "mistral-7b": 32768,
    "phi-2": 2048,
    "qwen2.5-0.5b": 32768,
    "jamba-v0.1": 262144,
    "deepseek-v3": 131072,  # model card 128K; config.json 163840 (YaRN)
    "internlm-20b": 16384,  # model card 16k; config.json 4096
}


def test_every_catalog_model_has_a_cited_max_context():
    for name in model_names():
        spec = load_model(name)
        assert spec.max_context_tokens is not None and spec.max_context_tokens >= 2048, name
        text = (_catalog_dir() / f"{name}.toml").read_text()
        (line,) = [x for x in text.splitlines() if x.startswith("max_context_tokens")]
        assert "max_position_embeddings" in line or "model card" in line, (name, line)
    for name, tokens in PUBLISHED.items():
        assert load_model(name).max_context_tokens == tokens, name


def test_a_model_file_may_leave_it_out_but_not_give_nonsense():
    text = (_catalog_dir() / "llama-3.2-1b.toml").read_text()
    without = re.sub(r"(?m)^max_context_tokens = .*\n", "", text)
    assert parse_model(without, "mine.toml").max_context_tokens is None  # no limit
    for bad in ("0", "-5", "true", '"128k"'):
        with pytest.raises(ConfigError) as info:
            parse_model(without.replace("\n[[", f"\nmax_context_tokens = {bad}\n\n[[", 1), "m")
        one_line(info, "max_context_tokens")


def _long_trace():
    return make_trace(
        [
            Req([(1, 200_000)], 10, arrival_s=0.0),  # the 200,000-token prompt
            Req([(2, 131_000)], 72, arrival_s=1.0),  # prompt + output = 131,072: fits
            Req([(3, 131_000)], 73, arrival_s=2.0),  # one token beyond
            Req([(4, 1_000)], 50, arrival_s=3.0),
        ]
    )


def test_a_request_beyond_the_context_is_refused_as_vllm_does():
    result = simulate(
        _long_trace(), load_model("llama-3.1-8b"), load_profile("h100-sxm"), EngineConfig()
    )
    status = result.requests.column("status").to_pylist()
    assert status == ["rejected", "completed", "rejected", "completed"]


def test_the_run_warning_counts_the_requests_beyond_the_context():
    outcome = run(RunConfig(trace="sharegpt", model="llama-3.1-8b"), trace=_long_trace())
    s = outcome.summary
    assert (s["completed"], s["rejected"]) == (2, 2)
    (warning,) = [w for w in s["run_warnings"] if "refused" in w]
    assert warning.startswith("2 of 4 requests completed: 2 were refused because prompt + output")
    assert "context of 131,072 tokens" in warning and "200,010 tokens" in warning
    assert "KV blocks" not in warning and "give each replica more KV" not in warning


def test_a_short_context_model_refuses_what_a_long_one_serves():
    """The same trace on a 4,096-token model: its long requests are refused with a count, the
    short ones served; on a 131,072-token model all are served (no KV-block refusal either)."""
    reqs = [Req([(i, n)], 64, arrival_s=float(i)) for i, n in enumerate([100, 5000, 4032, 4033])]
    short = run(RunConfig(trace="sharegpt", model="llama-2-7b"), trace=make_trace(reqs))
    status = short.result.requests.column("status").to_numpy(zero_copy_only=False)
    assert np.array_equal(status == "rejected", [False, True, False, True])
    assert any("2 were refused" in w and "4,096" in w for w in short.summary["run_warnings"])
    long = run(RunConfig(trace="sharegpt", model="llama-3.1-8b"), trace=make_trace(reqs))
    assert long.summary["rejected"] == 0 and long.summary["completed"] == 4

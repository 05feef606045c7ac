"""`kvsim calibrate --device cpu` end to end on a tiny model: profile, report, validation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_measured import TINY

from kvsim.calibrate import NEEDS_TORCH, calibrate, run_calibration
from kvsim.errors import KvsimError
from kvsim.hardware import load_profile
from kvsim.hardware.measured import make_cost_model
from kvsim.models import load_model


def _tiny(tmp_path: Path) -> Path:
    """The 2-layer, hidden-256 model of the unit tests, as a model file."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_cpu_calibration_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'kvsim[calibrate]'")
    model = _tiny(tmp_path)
    out = tmp_path / "measured" / "cpu-tiny.toml"
    result = CliRunner().invoke(
        calibrate,
        [
            "--device",
            "cpu",
            "--model",
            str(model),
            "--quick",
            "--out",
            str(out),
            "--storage-dir",
            str(tmp_path),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output and "forward pass" in result.output
    profile = load_profile(out)  # through validation
    assert profile.name == "cpu-tiny" and profile.measured["device_kind"] == "cpu"
    cost = make_cost_model(load_model(str(model)), profile)
    assert cost.kind == "measured"
    assert cost.iteration_time_s([(100, 0)], [300] * 4) > 0
    report = out.with_suffix(".report.md").read_text()
    assert "Held-out shapes" in report and "End to end" in report and "CPU" in report
    pngs = sorted(p.name for p in out.with_suffix(".report").glob("*.png"))
    assert {"gemm.png", "decode_attention.png", "forward.png", "copy_h2d.png"} <= set(pngs)
    validation = profile.measured["validation"]
    assert "forward_median_error" in validation and "gemm_median_error" in validation
    _simulate_with_measured_profile(load_model(str(model)), profile)


def _simulate_with_measured_profile(spec, profile) -> None:
    """The engine takes its iteration times from the measured tables, and says so."""
    import dataclasses

    from helpers import Req, make_trace

    from kvsim.engine import EngineConfig, simulate

    lone = make_trace([Req([(1, 700)], output_tokens=1)])
    config = EngineConfig(num_gpu_blocks=2000)
    measured = simulate(lone, spec, profile, config)
    roofline = simulate(lone, spec, dataclasses.replace(profile, measured={}), config)
    assert (measured.cost_model, roofline.cost_model) == ("measured", "roofline")
    ttft = measured.requests.column("ttft_s")[0].as_py()
    assert ttft == pytest.approx(make_cost_model(spec, profile).prefill_time_s(700), rel=1e-12)
    assert ttft != roofline.requests.column("ttft_s")[0].as_py()


def test_missing_torch_is_a_one_line_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(KvsimError) as info:
        run_calibration("qwen2.5-0.5b", tmp_path / "x.toml", device="cpu", quick=True)
    assert str(info.value) == NEEDS_TORCH


def test_unsupported_model_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'kvsim[calibrate]'")
    with pytest.raises(KvsimError, match="mixture-of-experts"):
        run_calibration("mixtral-8x7b", tmp_path / "x.toml", device="cpu", quick=True)

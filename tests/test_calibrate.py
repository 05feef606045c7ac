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
    assert profile.measured["rounds"] >= 3 and profile.measured["scrub_bytes"] > 0
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


def test_plan_keeps_fitted_and_checked_points_apart() -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'kvsim[calibrate]'")
    from kvsim.calibrate.run import make_plan

    for device in ("cpu", "cuda"):
        for quick in (True, False):
            plan = make_plan(device, quick)
            assert not set(plan.tokens) & set(plan.tokens_held)
            assert not set(plan.prefill) & set(plan.prefill_held)
            grid = {(b, c) for b in plan.decode_batch for c in plan.decode_context}
            assert not grid & set(plan.decode_held)
            fit = {(b.prefill, b.decode, b.decode_context) for b in plan.fit_batches}
            assert not fit & {(b.prefill, b.decode, b.decode_context) for b in plan.batches}


def test_grouped_decode_matches_per_head_attention() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import torch.nn.functional as F

    from kvsim.calibrate.ops import decode_batch, mla_decode

    gen = torch.Generator().manual_seed(0)
    b, heads, kvh, d, ctx = 3, 8, 2, 16, 10
    q, k, v = (torch.randn(b, h, d, generator=gen) for h in (heads, kvh, kvh))
    kc, vc = (torch.randn(b, kvh, ctx + 1, d, generator=gen) for _ in range(2))
    out = decode_batch(q, k, v, kc, vc, ctx)
    ref = F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True)
    assert torch.allclose(out, ref[:, :, 0].reshape(b, -1), atol=1e-5)
    ql = torch.randn(b, heads, 1, 12, generator=gen)
    cache = torch.randn(b, 1, ctx, 12, generator=gen)
    ref = F.scaled_dot_product_attention(ql, cache, cache[..., :8], enable_gqa=True)
    assert torch.allclose(mla_decode(ql, cache, 8), ref, atol=1e-5)


def test_measure_interleaves_rounds_and_settles_each_probe() -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from kvsim.calibrate.bench import Probe, measure

    calls: list[str] = []

    def probe(name: str, seconds: float):
        def build():
            return lambda: calls.append(name) or {"a": seconds, "b": 2 * seconds}

        return Probe(build)

    out = measure([probe("x", 1.0), probe("y", 2.0)], rounds=3, reps=1, warmup=1, target_s=0.5)
    # warm-up, then one timed call a round; later rounds go the other way and settle with an
    # untimed call first, except a call long enough (y: 6 s > 10 x 0.5 s) to settle itself
    assert "".join(calls) == "xxyy" + "yxx" + "xxy"  # rounds 1, 2, 3
    assert [{k: t.seconds for k, t in parts.items()} for parts in out] == [
        {"a": 1.0, "b": 2.0},
        {"a": 2.0, "b": 4.0},
    ]


def test_layer_sampler_times_every_part_of_a_layer(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    from kvsim.calibrate.bench import layer_sampler
    from kvsim.calibrate.decoder import Batch, RandomDecoder

    spec = load_model(str(_tiny(tmp_path)))
    decoder = RandomDecoder(spec, 1, torch.bfloat16, "cpu", layers=2)
    with torch.inference_mode():
        sample = layer_sampler(decoder, Batch("mixed", ((8, 24),), 3, 40), torch.device("cpu"))
        parts = sample()
    assert set(parts) == {"qkv", "o", "gate_up", "down", "elementwise", "attention"}
    assert all(s > 0 for s in parts.values())


MLA = """
name = "tiny-mla"
hf_config = "none/tiny-mla"
hidden_size = 256
num_layers = 2
num_attention_heads = 4
vocab_size = 1024
tie_word_embeddings = true

[[layer_groups]]
kind = "mla"
layers = 2
num_heads = 4
kv_lora_rank = 64
qk_rope_head_dim = 16
qk_nope_head_dim = 32
v_head_dim = 32

[[mlp_groups]]
layers = 2
intermediate_size = 512
"""


def test_mla_is_timed_kernel_by_kernel_without_a_forward_check(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'kvsim[calibrate]'")
    from kvsim.calibrate.run import calibrate as run

    path = tmp_path / "mla.toml"
    path.write_text(MLA)
    result = run(load_model(str(path)), None, quick=True, storage_dir=str(tmp_path))
    assert not result.forward and "MLA is not supported" in result.notes[0]
    assert {"q", "kv_a", "kv_b", "o", "lm_head"} <= set(result.measured["gemm"])
    assert make_cost_model(load_model(str(path)), result.profile).kind == "measured"

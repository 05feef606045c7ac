"""`kvsim calibrate import-vidur`: Vidur's profiling CSVs (a trimmed sample in tests/data/vidur,
see its PROVENANCE.md) become a measured profile that reproduces them and names its gaps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.calibrate.vidur_import import thin, two_per_octave
from kvsim.cli import main
from kvsim.costmodel import MeasuredCostModel, make_cost_model
from kvsim.costmodel.kernels import allreduce_s
from kvsim.hardware import load_profile
from kvsim.models import load_model

DATA = Path(__file__).resolve().parent / "data" / "vidur"
GEMM_OPS = {
    "qkv": "attn_pre_proj",
    "o": "attn_post_proj",
    "gate_up": "mlp_up_proj",
    "down": "mlp_down_proj",
}
ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")


def _import(capsys, folder: Path, out: Path, *extra: str, tp: int = 2, model: str = "llama-2-70b"):
    args = ["calibrate", "import-vidur", str(folder), "--model", model, "--tp", str(tp)]
    main([*args, "--out", str(out), *extra])
    return capsys.readouterr().out


def _cost(out: Path, tp: int = 2) -> MeasuredCostModel:
    cost = make_cost_model(
        load_model("llama-2-70b"),
        load_profile(out),
        tp=tp,
        weight_dtype="fp16",
        kv_dtype="bf16",
        engine=None,
    )
    assert isinstance(cost, MeasuredCostModel), cost.reason
    return cost


def test_import_reproduces_vidur_at_its_points(tmp_path: Path, capsys) -> None:
    out = tmp_path / "a100-llama-2-70b-tp2.toml"
    printed = _import(capsys, DATA, out, "--profile", "a100-80gb", "--commit", "7d47513")
    assert f"wrote {out}" in printed and "filled from the roofline: gemm.lm_head\n" in printed
    cost = _cost(out)
    assert cost.reason == "measured by https://github.com/microsoft/vidur on A100 SXM 80GB"
    m = load_profile(out).measured
    assert m["filled_from_roofline"] == ["gemm.lm_head"]
    assert m["licence"] == "MIT" and m["source_commit"] == "7d47513"
    assert any(f.startswith("mlp.csv (git blob ") for f in m["source_files"])

    mlp = pd.read_csv(DATA / "mlp.csv")
    mlp = mlp[mlp.num_tensor_parallel_workers == 2].drop_duplicates("num_tokens", keep="last")
    tokens = mlp.num_tokens.to_numpy(dtype=float)
    curves = dict(zip(m["gemm"], cost.gemm, strict=True))
    for role, op in GEMM_OPS.items():
        vidur = mlp[f"time_stats.{op}.median"].to_numpy() * 1e-3
        assert np.allclose(curves[role][2](tokens), vidur, rtol=1e-9), role
    vidur = sum(mlp[f"time_stats.{op}.median"].to_numpy() for op in ELEMENTWISE) * 1e-3
    assert np.allclose(cost.elementwise(tokens), vidur, rtol=1e-9)

    att = pd.read_csv(DATA / "attention.csv")
    layers = 80
    fresh = att[att.is_prefill & (att.kv_cache_size == 0)]  # a point timed twice: its median
    fresh = fresh.groupby("prefill_chunk_size")["time_stats.attn_prefill.median"].median()
    for n, t in fresh.items():
        assert cost.prefill_attention_s(int(n), 0) == pytest.approx(layers * t * 1e-3, rel=1e-9)
    cached = att[att.is_prefill & (att.kv_cache_size > 0)]
    table = m["prefill_attention_cached"]
    for n, c, t in zip(table["tokens"], table["context"], table["seconds"], strict=True):
        row = cached[(cached.prefill_chunk_size == n) & (cached.kv_cache_size == c)]
        assert t == pytest.approx(row["time_stats.attn_prefill.median"].median() * 1e-3, rel=1e-9)
        assert cost.prefill_attention_s(n, c) == pytest.approx(layers * t, rel=1e-9)
    decode = att[~att.is_prefill].groupby(["batch_size", "kv_cache_size"])
    decode = decode["time_stats.attn_decode.median"].median()
    grid = m["decode_attention"]
    assert len(grid["batch"]) * len(grid["context"]) == len(decode)  # the sample's whole grid
    for (b, c), t in decode.items():
        assert float(cost.decode(float(b), float(c))) == pytest.approx(t * 1e-3, rel=1e-9)

    ar = pd.read_csv(DATA / "all_reduce.csv")
    ar = ar[(ar.num_workers == 2) & (ar.devices_per_node == 2)]
    assert cost.allreduce is not None  # the measured curve, not the roofline
    bytes_per_token = 8192 * 2
    for nbytes, t in zip(m["allreduce"]["bytes"], m["allreduce"]["seconds"], strict=True):
        row = ar[ar["size"] == nbytes]
        assert t == pytest.approx(row["time_stats.all_reduce.median"].iloc[0] * 1e-3, rel=1e-9)
        got = float(cost.allreduce_time_s(nbytes / bytes_per_token))
        assert got == pytest.approx(2 * layers * t, rel=1e-9)


def test_gaps_are_filled_from_the_roofline_and_named(tmp_path: Path, capsys) -> None:
    """At tp 4 the sample has no attention rows; the overhead comes from cpu_overheads.csv."""
    out = tmp_path / "tp4.toml"
    printed = _import(capsys, DATA, out, "--profile", "a100-80gb", tp=4)
    filled = ["gemm.lm_head", "prefill_attention", "decode_attention", "prefill_attention_cached"]
    assert f"filled from the roofline: {', '.join(filled)}" in printed
    assert "attention.csv has no rows at tp 4 (has tp 2)" in printed
    m = load_profile(out).measured
    assert m["filled_from_roofline"] == filled and "allreduce" in m
    cpu = pd.read_csv(DATA / "cpu_overheads.csv")
    cpu = cpu[cpu.tensor_parallel_degree == 4]
    parts = ["schedule", "prepare_inputs_e2e", "sampler_e2e", "process_model_outputs"]
    expected = np.median(sum(cpu[f"{p}_median"] for p in parts)) * 1e-3
    assert m["overhead_s"] == pytest.approx(expected, rel=1e-12)
    assert _cost(out, tp=4).overhead_s == pytest.approx(expected, rel=1e-12)


def test_vidur_layout_picks_gpu_and_base_and_fills_missing_files(tmp_path: Path, capsys) -> None:
    """Vidur's own layout: the GPU folder names the base profile; no attention.csv and no
    all_reduce.csv are gaps, priced by the base profile's kernels and all-reduce algorithms."""
    root = tmp_path / "profiling"
    here = root / "compute" / "a100" / "meta-llama" / "Llama-2-70b-hf"
    here.mkdir(parents=True)
    shutil.copy(DATA / "mlp.csv", here / "mlp.csv")
    out = tmp_path / "layout.toml"
    printed = _import(capsys, root, out)
    assert "(layout: a100-80gb + Vidur tables, tp=2)" in printed
    assert "allreduce: no all_reduce.csv; the profile's all-reduce algorithms price it" in printed
    profile = load_profile(out)
    assert profile.measured["filled_from_roofline"][-1] == "allreduce"
    assert "allreduce" not in profile.measured
    assert profile.measured["source_files"][0].startswith(
        "compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv (git blob "
    )
    cost = _cost(out)
    assert cost.allreduce is None
    expected = 160 * allreduce_s(profile.allreduce_algorithms, 100 * 8192 * 2, 2)
    assert float(cost.allreduce_time_s(100)) == pytest.approx(expected, rel=1e-12)


def test_imported_profile_drives_a_run(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run.toml"
    _import(capsys, DATA, out, "--profile", "a100-80gb")
    main(["profile", "validate", str(out)])
    assert "ok" in capsys.readouterr().out
    runs = tmp_path / "runs"
    args = ["run", "--hardware", str(out), "--model", "llama-2-70b", "--tp", "2"]
    main([*args, "--max-requests", "20", "--out", str(runs)])
    summary = json.loads(next(runs.rglob("summary.json")).read_text())
    assert summary["cost_model"] == "measured"
    assert "microsoft/vidur" in summary["cost_model_reason"]


def _bad_mlp(folder: Path) -> None:
    frame = pd.read_csv(DATA / "mlp.csv").drop(columns=["time_stats.mlp_up_proj.median"])
    frame.to_csv(folder / "mlp.csv", index=False)


def _copy_all(folder: Path) -> None:
    for name in ("mlp.csv", "attention.csv", "all_reduce.csv"):
        shutil.copy(DATA / name, folder / name)


@pytest.mark.parametrize(
    ("setup", "args", "expected"),
    [
        (_copy_all, ["--model", "llama-2-7b"], "are not llama-2-7b's (hidden 4096, heads 32"),
        (lambda f: None, [], "nor a folder holding mlp.csv"),
        (_bad_mlp, [], "mlp.csv: missing column 'time_stats.mlp_up_proj.median'"),
        (
            lambda f: (_copy_all(f), (f / "attention.csv").write_bytes(b"\xff\xfe\x00junk")),
            [],
            "attention.csv: ",
        ),
        (
            lambda f: (_copy_all(f), (f / "all_reduce.csv").write_text("size,seconds\n1,2\n")),
            [],
            "all_reduce.csv: missing column",
        ),
        (_copy_all, ["--tp", "8"], "mlp.csv: no rows at --tp 8 (Vidur profiled tp 2, 4)"),
        (_copy_all, ["--model", "mixtral-8x7b"], "--model: Vidur's tables describe dense"),
    ],
    ids=["shape", "empty", "no-column", "binary", "all-reduce", "tp", "moe"],
)
def test_bad_input_is_one_line_exit_2_and_no_file(
    tmp_path: Path, capsys, setup, args, expected
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    setup(folder)
    out = tmp_path / "out" / "p.toml"
    base = ["calibrate", "import-vidur", str(folder), "--model", "llama-2-70b", "--tp", "2"]
    argv = [*base, "--out", str(out), "--profile", "a100-80gb"]
    # later options win in click, so the case's own --model / --tp replace the defaults
    with pytest.raises(SystemExit) as info:
        main([*argv, *args])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no temporary file either


def test_no_base_for_a_flat_folder_is_refused(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "import-vidur", str(DATA), "--model", "llama-2-70b", "--tp", "2"])
    assert info.value.code == 2 and "--out" in capsys.readouterr().err
    argv = ["calibrate", "import-vidur", str(DATA), "--model", "llama-2-70b"]
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path / "x.toml")])
    assert "--profile: " in capsys.readouterr().err and not (tmp_path / "x.toml").exists()


def test_measure_stays_the_default_subcommand(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "--device", "cpu"])  # `kvsim calibrate OPTIONS` still measures
    assert info.value.code == 2 and "--model" in capsys.readouterr().err


def test_thin_keeps_one_real_median_point_per_bin() -> None:
    x = np.array([10.0, 11, 12, 13, 14, 100, 101, 102, 103, 104, 1000])
    t = np.array([5.0, 1, 3, 2, 4, 9, 7, 8, 6, 10, 1])
    keep = thin(x, t, per_decade=1, min_points=5)
    # the last bin (one point) joins the one before; medians: t=3 (x=12) and t=7 of six (x=101)
    assert keep.tolist() == [2, 6] and len(set(keep.tolist())) == len(keep)
    assert two_per_octave(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9])) == [1, 2, 3, 4, 6, 8, 9]


SHIPPED = sorted(
    (Path(__file__).resolve().parents[1] / "hardware_profiles" / "measured").glob("*vidur*.toml")
)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_vidur_profiles_carry_provenance_and_price_their_model(path: Path) -> None:
    profile = load_profile(f"measured/{path.stem}")
    m = profile.measured
    assert m["source"] == "https://github.com/microsoft/vidur" and m["licence"] == "MIT"
    assert len(m["source_commit"]) == 40 and m["source_files"] and m["source_note"]
    assert "Copyright (c) Microsoft Corporation" in path.read_text()
    assert m["filled_from_roofline"] == ["gemm.lm_head"]  # the rest is Vidur's
    model = load_model(m["model"])
    cost = make_cost_model(model, profile, tp=m["tp"], weight_dtype=model.weight_dtype, engine=None)
    assert cost.kind == "measured" and cost.allreduce is not None


def test_a_vidur_profile_is_shipped() -> None:
    assert [p.stem for p in SHIPPED] == ["a100-80gb-vidur-llama-2-70b-tp2"]

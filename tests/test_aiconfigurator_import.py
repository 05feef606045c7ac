"""`kvsim calibrate import-aiconfigurator` on the hand-made fixture
(tests/data/aiconfigurator_fixture/make_fixture.py): the profile holds the values worked out by
hand below, kvsim prices with it as a measured cost model, and bad input is one line, exit 2."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from helpers import in_process

from kvsim.calibrate.aiconfigurator_import import around, gemm_curve
from kvsim.costmodel import make_cost_model
from kvsim.hardware import load_profile
from kvsim.models import load_model

FIXTURE = Path(__file__).resolve().parent / "data" / "aiconfigurator_fixture"
SYSTEMS = FIXTURE / "aiconfigurator_core" / "systems"
H100 = SYSTEMS / "data" / "h100_sxm"
MODEL = "llama-3.1-8b"  # per GPU at TP 2: 16 heads, 4 KV heads, head dim 128


def _import(capsys, out: Path, *extra: str, data: Path = FIXTURE, gpu: str = "h100_sxm"):
    args = ["calibrate", "import-aiconfigurator", "--gpu", gpu, "--engine", "vllm"]
    args += ["--model", MODEL, "--tp", "2", "--data", str(data), "--out", str(out), *extra]
    return in_process(capsys, *args)


@pytest.fixture
def imported(tmp_path, capsys):
    """(profile path, what the command printed, its [measured] table)."""
    out = tmp_path / "h100-aic.toml"
    code, stdout, stderr = _import(capsys, out)
    assert (code, stderr) == (0, ""), stderr
    return out, stdout, load_profile(out).measured


def test_gemm_exact_and_interpolated_shapes(imported):
    gemm = imported[2]["gemm"]
    # qkv: n = 16 x 128 + 2 x 4 x 128 = 3072, k = 4096, measured exactly at 1e-12 s an element
    # and m factor 1 / 1.5 / 4: 3072 x 4096 x 1e-12 = 1.2582912e-5 s at m = 1
    assert gemm["qkv"]["tokens"] == [1, 16, 256]
    assert gemm["qkv"]["seconds"] == pytest.approx([1.2582912e-5, 1.8874368e-5, 5.0331648e-5])
    # gate_up: n = 2 x 14336 / 2 = 14336, halfway between 12288 and 16384 at k 4096 (bilinear
    # in n and k): (12288 x 4096 x 1e-12 + 16384 x 4096 x 2e-12) / 2
    # = (5.0331648e-5 + 1.34217728e-4) / 2 = 9.2274688e-5 s at m = 1
    assert gemm["gate_up"]["seconds"][0] == pytest.approx(9.2274688e-5, rel=1e-9)
    assert gemm["gate_up"]["seconds"][2] == pytest.approx(4 * 9.2274688e-5, rel=1e-9)
    # down: k = 7168, three quarters of the way from 4096 (3e-12 s an element) to 8192 (1e-12):
    # 0.25 x 4096 x 4096 x 3e-12 + 0.75 x 4096 x 8192 x 1e-12
    # = 1.2582912e-5 + 2.5165824e-5 = 3.7748736e-5 s at m = 1
    assert gemm["down"]["seconds"][0] == pytest.approx(3.7748736e-5, rel=1e-9)
    # o: n 4096 x k 2048 measured at 2e-12 s an element: 1.6777216e-5 s
    assert gemm["o"]["seconds"][0] == pytest.approx(1.6777216e-5)
    assert [gemm[r]["calls"] for r in ("qkv", "o", "gate_up", "down", "lm_head")] == [32] * 4 + [1]


def test_attention_and_allreduce_tables(imported):
    _, _, m = imported
    # batch-1 prompts of 16 / 256 / 1024 tokens: 0.010 / 0.020 / 0.080 ms; the batch-2, fp8,
    # TP-1-shape and windowed rows of the fixture are not this model's
    assert m["prefill_attention"] == {
        "tokens": [16, 256, 1024],
        "context": [0, 0, 0],
        "seconds": pytest.approx([10e-6, 20e-6, 80e-6]),
    }
    # decode: contexts isl + step = 16 / 256 / 1024; (batch 4, 1024) is not measured and is
    # 4 x the batch-1 time there: 4 x 0.020 ms = 80 us
    assert m["decode_attention"]["batch"] == [1, 4]
    assert m["decode_attention"]["context"] == [16, 256, 1024]
    assert m["decode_attention"]["seconds"][0] == pytest.approx([10e-6, 12e-6, 20e-6])
    assert m["decode_attention"]["seconds"][1] == pytest.approx([11e-6, 30e-6, 80e-6])
    # vLLM: custom all-reduce (graph) up to 8 MiB, NCCL above: 1024 elements (2 KiB) 4 us,
    # 4 Mi elements (8 MiB, at the limit) 30 us, 8 Mi elements (16 MiB) NCCL's 60 us (not the
    # custom kernel's 70 us)
    assert m["allreduce"]["bytes"] == [2048, 8 * 2**20, 16 * 2**20]
    assert m["allreduce"]["seconds"] == pytest.approx([4e-6, 30e-6, 60e-6])


def test_gaps_and_provenance_are_named(imported):
    _, stdout, m = imported
    assert m["filled_from_roofline"] == [
        "gemm.lm_head",  # n = 128256 / 2 = 64128 is above the fixture's largest n, 16384
        "prefill_attention_cached",
        "elementwise",
    ]
    assert "gemm.lm_head: n 64128 x k 4096 is outside the measured grid" in stdout
    assert "1 of 6 (batch, context) cells" in stdout
    assert (m["model"], m["tp"], m["dtype"], m["kv_dtype"]) == (MODEL, 2, "bf16", "bf16")
    assert m["device"] == "NVIDIA H100 80GB HBM3"
    assert m["licence"] == "Apache-2.0"
    assert "pypi.org/project/aiconfigurator-core" in m["source"]
    assert "aiconfigurator-core 0.12.0" in m["source"]
    for rel in (
        "gemm/vllm/0.24.0/gemm_perf.parquet",
        "attention/vllm/0.24.0/context_attention_perf.parquet",
        "attention/vllm/0.24.0/generation_attention_perf.parquet",
        "comm/vllm/0.24.0/custom_allreduce_perf.parquet",
        "comm/nccl/2.29.2/nccl_perf.parquet",
    ):
        digest = hashlib.sha256((H100 / rel).read_bytes()).hexdigest()
        line = f"aiconfigurator_core/systems/data/h100_sxm/{rel} (sha256 {digest})"
        assert line in m["source_files"]


def test_the_profile_prices_as_a_measured_model(imported):
    out = imported[0]
    model = load_model(MODEL)
    cost = make_cost_model(model, load_profile(out), tp=2)
    assert cost.kind == "measured"
    assert "AIConfigurator" in cost.reason
    # a decode step of batch 1 at context 256 costs at least its measured attention (12 us a
    # layer over 32 layers) and its measured qkv GEMM (12.6 us, 32 calls)
    step = cost.iteration_time_s([], [256])
    assert step > 32 * 12e-6 + 32 * 1.2582912e-5
    elsewhere = make_cost_model(model, load_profile(out), tp=1)
    assert elsewhere.kind == "roofline"


def test_interpolation_helpers():
    import numpy as np
    import pandas as pd

    assert around(np.array([32, 64, 128]), 64) == [64]
    assert around(np.array([32, 64, 128]), 100) == [64, 128]
    assert around(np.array([32, 64, 128]), 129) is None
    rows = pd.DataFrame(
        {"m": [1, 1], "n": [64, 128], "k": [32, 32], "latency_s": [64 * 32e-12, 128 * 32 * 4e-12]}
    )
    # n 90 between 64 and 128: w = 26 / 64 = 0.40625;
    # 0.59375 x 2.048e-9 + 0.40625 x 1.6384e-8 = 1.216e-9 + 6.656e-9 = 7.872e-9 s
    tokens, seconds, how = gemm_curve(rows, 90, 32)
    assert tokens == [1] and how.startswith("interpolated")
    assert seconds[0] == pytest.approx(7.872e-9, rel=1e-9)


def _broken(tmp_path: Path, gpu: str = "h100_sxm") -> Path:
    root = tmp_path / "data"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    if gpu != "h100_sxm":
        data = root / "aiconfigurator_core" / "systems" / "data"
        (data / "h100_sxm").rename(data / gpu)
    return root


@pytest.mark.parametrize(
    ("change", "extra", "message"),
    [
        (None, ("--gpu", "x100"), "no tables for GPU 'x100'; GPUs with tables: h100_sxm"),
        (None, ("--engine", "sglang"), "--engine sglang: no tables for it on h100_sxm"),
        (
            "no-decode",
            (),
            "no attention/vllm/*/generation_attention_perf.parquet for h100_sxm",
        ),
        ("no-column", (), "gemm_perf.parquet: missing column 'm'"),
        (None, ("--model", "mixtral-8x7b"), "mixture-of-experts MLP"),
        (None, ("--weight-dtype", "int4"), "--weight-dtype int4"),
        ("b60", ("--gpu", "b60"), "--gpu b60: kvsim has no base profile for it"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, change, extra, message):
    data = FIXTURE
    if change == "no-decode":
        data = _broken(tmp_path)
        rel = "aiconfigurator_core/systems/data/h100_sxm/attention/vllm/0.24.0"
        (data / rel / "generation_attention_perf.parquet").unlink()
    elif change == "no-column":
        import pandas as pd

        data = _broken(tmp_path)
        path = data / "aiconfigurator_core/systems/data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
        pd.read_parquet(path).drop(columns="m").to_parquet(path)
    elif change == "b60":
        data = _broken(tmp_path, "b60")
    out = tmp_path / "out.toml"
    code, _, stderr = _import(capsys, out, *extra, data=data)  # a later option wins
    assert code == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_trtllm_all_reduce_is_its_own(tmp_path):
    """TensorRT-LLM's all-reduce op picks its strategy itself: its rows at every size (no NCCL
    switch); where it has only its multi-node NVLink kernels, the faster of them per size."""
    import pandas as pd

    from kvsim.calibrate.aiconfigurator_data import open_database
    from kvsim.calibrate.aiconfigurator_import import Request, _allreduce_table

    root = _broken(tmp_path)
    rows = [
        ("TRTLLM", 2, 1024, 0.003),
        ("TRTLLM", 2, 8 * 2**20, 0.090),  # 16 MiB: above vLLM's limit, still its own
        ("TRTLLM_MNNVL_oneshot", 4, 1024, 0.005),
        ("TRTLLM_MNNVL_twoshot", 4, 1024, 0.007),
        ("TRTLLM_MNNVL_twoshot", 4, 4 * 2**20, 0.040),
    ]
    frame = pd.DataFrame(rows, columns=["kernel_source", "num_gpus", "message_size", "latency"])
    frame["allreduce_dtype"] = "bfloat16"
    frame["implementation"] = "trtllm"
    folder = root / "aiconfigurator_core/systems/data/h100_sxm/comm/trtllm/1.3.0rc20"
    folder.mkdir(parents=True)
    frame.to_parquet(folder / "custom_allreduce_perf.parquet")
    db = open_database(root)
    model = load_model(MODEL)
    table, how = _allreduce_table(db, Request("h100_sxm", "trtllm", model, 2))
    assert (table, how) == (
        {"bytes": [2048, 16 * 2**20], "seconds": pytest.approx([3e-6, 90e-6])},
        "trtllm's own all-reduce",
    )
    table, how = _allreduce_table(db, Request("h100_sxm", "trtllm", model, 4))
    # 2 KiB: oneshot's 5 us beats twoshot's 7 us; 8 MiB: only twoshot measured it
    assert table == {"bytes": [2048, 8 * 2**20], "seconds": pytest.approx([5e-6, 40e-6])}
    assert "trtllm_mnnvl_oneshot / trtllm_mnnvl_twoshot" in how
    table, how = _allreduce_table(db, Request("h100_sxm", "trtllm", model, 8))
    assert table is None
    assert how == "no nccl or trtllm all-reduce rows at 8 GPUs (they have 2, 4)"

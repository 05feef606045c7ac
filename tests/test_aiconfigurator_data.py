"""kvsim.calibrate.aiconfigurator_data: NVIDIA's kernel tables read in seconds and bytes, from
the wheel, an extracted copy (tests/data/aiconfigurator_fixture, hand-made rows) or the shipped
subset, with every bad table refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from kvsim.calibrate.aiconfigurator_data import (
    ENV_VAR,
    SUBSET,
    WHEEL_PREFIX,
    open_database,
    version_key,
)
from kvsim.errors import ConfigError

FIXTURE = Path(__file__).resolve().parent / "data" / "aiconfigurator_fixture"
TABLES = FIXTURE / "aiconfigurator_core" / "systems" / "data" / "h100_sxm"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "fixture"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return root


def test_gemm_in_seconds_with_plain_names():
    db = open_database(FIXTURE)
    assert (db.kind, db.wheel_version, db.gpus()) == ("directory", "0.12.0", ["h100_sxm"])
    assert db.engines("h100_sxm") == {"vllm": ["0.24.0"]}
    g = db.gemm("h100_sxm", "vllm")
    assert list(g.columns[:6]) == ["m", "n", "k", "dtype", "latency_s", "kernel_source"]
    row = g[(g.n == 3072) & (g.k == 4096) & (g.m == 1) & (g.dtype == "bfloat16")]
    # stored 0.012582912 ms (3072 x 4096 x 1e-12 s, written in ms by make_fixture.py)
    assert row.latency_s.item() == pytest.approx(1.2582912e-05, rel=1e-12)
    fp8 = g[g.dtype == "fp8"]
    assert fp8.latency_s.tolist() == pytest.approx([0.5e-9 * 1e3 * 1e-3])
    assert g.attrs["files"] == ["data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"]


def test_attention_columns_and_decode_context():
    db = open_database(FIXTURE)
    c = db.context_attention("h100_sxm", "vllm")
    first = ["batch", "isl", "num_heads", "num_kv_heads", "head_dim", "kv_dtype", "window"]
    assert list(c.columns[:7]) == first
    one = c[(c.batch == 1) & (c.isl == 1024)]
    assert one.latency_s.item() == pytest.approx(80e-6)  # 0.080 ms
    assert sorted(c.window.unique()) == [0, 128]
    d = db.generation_attention("h100_sxm", "vllm")
    # a decode row attends isl + step cached tokens: isl 1, steps 15/255/1023
    assert sorted(d.context_tokens.unique()) == [16, 256, 1024]
    assert (d.context_tokens == d.isl + d.step).all()
    cell = d[(d.batch == 4) & (d.context_tokens == 256) & (d.kv_dtype == "bfloat16")]
    assert cell.latency_s.item() == pytest.approx(30e-6)


def test_attention_without_a_window_column_is_full_attention(tmp_path):
    root = _copy(tmp_path)
    path = (
        root / TABLES.relative_to(FIXTURE) / "attention/vllm/0.24.0/context_attention_perf.parquet"
    )
    pd.read_parquet(path).drop(columns="window_size").to_parquet(path)
    assert open_database(root).context_attention("h100_sxm", "vllm").window.unique().tolist() == [0]


def test_allreduce_bytes_and_implementations():
    a = open_database(FIXTURE).allreduce("h100_sxm", "vllm")
    assert sorted(a.implementation.unique()) == ["custom_eager", "custom_graph", "nccl"]
    graph = a[a.implementation == "custom_graph"].sort_values("message_bytes")
    # 1024, 4 Mi and 8 Mi bf16 elements: 2 bytes each
    assert graph.message_bytes.tolist() == [2048, 8 * 2**20, 16 * 2**20]
    assert graph.latency_s.tolist() == pytest.approx([4e-6, 30e-6, 70e-6])
    nccl = a[a.implementation == "nccl"]
    # all_gather is left out; int8 counts one byte an element
    assert len(nccl) == 5
    int8 = nccl[nccl.dtype == "int8"]
    assert (int8.message_bytes.item(), int8.latency_s.item()) == (1024, pytest.approx(9e-6))
    assert a.attrs["files"] == [
        "data/h100_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet",
        "data/h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet",
    ]


def test_the_wheel_is_read_as_a_zip_with_its_version_and_hashes(tmp_path):
    wheel = tmp_path / "aiconfigurator_core-0.12.0-cp311-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path in sorted(FIXTURE.rglob("*")):
            if path.is_file() and path.suffix != ".py":
                z.write(path, path.relative_to(FIXTURE).as_posix())
    db = open_database(wheel)
    assert (db.kind, db.wheel_version) == ("wheel", "0.12.0")
    folder = open_database(FIXTURE)
    pd.testing.assert_frame_equal(
        db.gemm("h100_sxm", "vllm"), folder.gemm("h100_sxm", "vllm"), check_like=True
    )
    prov = db.provenance()
    rel = "data/h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    want = hashlib.sha256((FIXTURE / "aiconfigurator_core/systems" / rel).read_bytes()).hexdigest()
    assert prov["files"] == [{"path": WHEEL_PREFIX + rel, "sha256": want}]
    assert prov["licence"] == "Apache-2.0"
    assert prov["source"] == "https://pypi.org/project/aiconfigurator-core/"
    assert prov["wheel_version"] == "0.12.0"


def test_newest_version_by_release_order(tmp_path):
    assert sorted(
        ["0.5.9", "0.5.10", "0.5.6.post2", "1.3.0rc5", "1.3.0", "1.3.0rc20", "0.1.dev9"],
        key=version_key,
    ) == ["0.1.dev9", "0.5.6.post2", "0.5.9", "0.5.10", "1.3.0rc5", "1.3.0rc20", "1.3.0"]
    root = _copy(tmp_path)
    gemm = root / TABLES.relative_to(FIXTURE) / "gemm/vllm"
    older = pd.read_parquet(gemm / "0.24.0/gemm_perf.parquet").head(2)
    (gemm / "0.9.0").mkdir()
    older.to_parquet(gemm / "0.9.0/gemm_perf.parquet")
    db = open_database(root)
    assert len(db.gemm("h100_sxm", "vllm")) == 19  # 0.24.0, not 0.9.0 (string order)
    assert len(db.gemm("h100_sxm", "vllm", "0.9.0")) == 2


def test_default_location_is_the_environment_variable(monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(FIXTURE))
    assert open_database().gpus() == ["h100_sxm"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda db: db.gemm("x100", "vllm"),
            "no tables for GPU 'x100'; GPUs with tables: h100_sxm",
        ),
        (
            lambda db: db.gemm("h100_sxm", "sglang"),
            "no gemm/sglang/*/gemm_perf.parquet for h100_sxm; engines with that table: vllm",
        ),
        (
            lambda db: db.gemm("h100_sxm", "vllm", "0.1.0"),
            "no gemm/vllm/0.1.0/gemm_perf.parquet for h100_sxm; versions with that table: 0.24.0",
        ),
    ],
)
def test_missing_tables_name_what_is_there(call, message):
    with pytest.raises(ConfigError) as err:
        call(open_database(FIXTURE))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_table_missing_a_column_is_named(tmp_path):
    root = _copy(tmp_path)
    path = root / TABLES.relative_to(FIXTURE) / "gemm/vllm/0.24.0/gemm_perf.parquet"
    pd.read_parquet(path).drop(columns="k").to_parquet(path)
    with pytest.raises(ConfigError, match=r"gemm_perf.parquet: missing column 'k'; it has "):
        open_database(root).gemm("h100_sxm", "vllm")


def test_a_latency_that_is_not_positive_is_named(tmp_path):
    root = _copy(tmp_path)
    path = root / TABLES.relative_to(FIXTURE) / "comm/nccl/2.29.2/nccl_perf.parquet"
    frame = pd.read_parquet(path)
    frame.loc[2, "latency"] = 0.0
    frame.to_parquet(path)
    with pytest.raises(ConfigError, match=r"nccl_perf.parquet: row 2: latency 0.0 is not a posi"):
        open_database(root).allreduce("h100_sxm", "vllm")


def test_bad_locations(tmp_path):
    with pytest.raises(ConfigError, match="no such file or folder"):
        open_database(tmp_path / "absent")
    with pytest.raises(ConfigError, match="no data/ folder of tables"):
        open_database(tmp_path)
    bad = tmp_path / "x.whl"
    bad.write_text("not a zip")
    with pytest.raises(ConfigError, match="not a readable zip"):
        open_database(bad)
    root = _copy(tmp_path)
    shutil.rmtree(root / "aiconfigurator_core-0.12.0.dist-info")
    with pytest.raises(ConfigError, match="cannot tell the aiconfigurator-core version"):
        open_database(root)


def test_the_shipped_subset_is_intact():
    """Every file the manifest lists is there with its hash; nine GPUs, three engines each."""
    db = open_database(SUBSET)
    manifest = json.loads((SUBSET / "manifest.json").read_text())
    assert (db.kind, db.wheel_version, manifest["licence"]) == ("subset", "0.12.0", "Apache-2.0")
    for rel, entry in manifest["files"].items():
        data = (SUBSET / "systems" / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], rel
    assert len(db.gpus()) == 9
    for gpu in db.gpus():
        assert set(db.engines(gpu)) == {"vllm", "sglang", "trtllm"}, gpu
    assert "Apache License" in (SUBSET / "LICENSE").read_text()
    total = sum(p.stat().st_size for p in SUBSET.rglob("*") if p.is_file())
    assert total <= 6_000_000

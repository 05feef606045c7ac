"""Issue 10, boundary validation: every bad input is one KvsimError line naming the file and the
row or field, never a traceback; each test is the issue's example plus its class."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from inputs import deny_reading, one_line

from kvsim.errors import ConfigError
from kvsim.hardware import load_profile, profiles_dir, validate_profile, with_overrides
from kvsim.hardware.durations import parse_duration
from kvsim.models import (
    check_tp,
    kv_bytes_per_block,
    kv_bytes_per_token,
    load_model,
    model_names,
    tp_degrees,
)
from kvsim.units import parse_rate, parse_size

H100_TEXT = (profiles_dir() / "h100-sxm.toml").read_text()


@pytest.fixture(autouse=True)
def _shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSIM_PROFILES", raising=False)


# --- item 2: NaN, inf, zero and negative physical quantities in profiles and models ------------


def _profile(tmp_path: Path, old: str, new: str) -> Path:
    assert old in H100_TEXT, old
    path = tmp_path / "bad.toml"
    path.write_text(H100_TEXT.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("bf16 = 989.4e12", "bf16 = nan", "gpu.flops.bf16"),  # the example
        ("bf16 = 989.4e12", "bf16 = inf", "gpu.flops.bf16"),
        ("bf16 = 989.4e12", "bf16 = 0.0", "gpu.flops.bf16"),
        ("bf16 = 989.4e12", "bf16 = -1e12", "gpu.flops.bf16"),
        ("gpu_usd_per_hour = 6.16", "gpu_usd_per_hour = nan", "gpu_usd_per_hour"),
        ("gpu_usd_per_hour = 6.16", "gpu_usd_per_hour = inf", "gpu_usd_per_hour"),
        ("gpu_memory_utilization = 0.9", "gpu_memory_utilization = nan", "gpu_memory_utilization"),
        ("gpu_memory_utilization = 0.9", "gpu_memory_utilization = 0.0", "gpu_memory_utilization"),
        ("compute = 0.76", "compute = inf", "efficiency.compute"),
        ("[efficiency]\n", "[efficiency]\niteration_overhead_s = nan\n", "iteration_overhead_s"),
        ("[efficiency]\n", "[efficiency]\niteration_overhead_s = inf\n", "iteration_overhead_s"),
        ("usd_per_gb_hour = 0.00053", "usd_per_gb_hour = nan", "tiers.dram.usd_per_gb_hour"),
        ('hbm = "80GB"', 'hbm = "0GB"', "gpu.hbm"),
        ('hbm = "80GB"', 'hbm = "1e400GB"', "gpu.hbm"),
        ('hbm_bandwidth = "3.35TB/s"', 'hbm_bandwidth = "0TB/s"', "gpu.hbm_bandwidth"),
        ('hbm_bandwidth = "3.35TB/s"', 'hbm_bandwidth = "1e400TB/s"', "gpu.hbm_bandwidth"),
        ('capacity = "2TB"', 'capacity = "0TB"', "tiers.dram.capacity"),
        ('read_bandwidth = "52.4GB/s"', 'read_bandwidth = "0GB/s"', "tiers.dram.read_bandwidth"),
        ('latency = "5us"', 'latency = "1e400s"', "tiers.dram.latency"),
        ('latency = "5us"', 'latency = "-5us"', "tiers.dram.latency"),
        ("gpus_per_node = 8", "gpus_per_node = 0", "gpus_per_node"),
    ],
)
def test_profile_refuses_nan_inf_zero_negative(tmp_path: Path, old: str, new: str, field: str):
    with pytest.raises(ConfigError) as info:
        validate_profile(_profile(tmp_path, old, new))
    one_line(info, "bad.toml", field)


def test_profile_allows_zero_price_and_latency(tmp_path: Path) -> None:
    """0 is a real value for a price (HBM is paid in the GPU's) and a latency; not NaN or inf."""
    path = _profile(tmp_path, 'latency = "5us"', 'latency = "0us"')
    assert validate_profile(path).tier("dram").latency_s == 0


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -1.0, "1e400GB", 10**400, "-1GB", True]
)
def test_units_refuse_non_finite_and_negative(value: object) -> None:
    with pytest.raises(ConfigError):
        parse_size(value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        parse_rate(value)  # type: ignore[arg-type]
    if not isinstance(value, str):
        with pytest.raises(ConfigError):
            parse_duration(value)  # type: ignore[arg-type]


MODEL = """
name = "tiny"
hf_config = "example/tiny"
hidden_size = 256
num_layers = 4
num_attention_heads = 4
vocab_size = 1000
tie_word_embeddings = true

[[layer_groups]]
kind = "full"
layers = 4
num_heads = 4
num_kv_heads = 2
head_dim = 64

[[mlp_groups]]
layers = 4
intermediate_size = 512
"""


def _model(tmp_path: Path, old: str, new: str) -> str:
    assert old in MODEL, old
    path = tmp_path / "m.toml"
    path.write_text(MODEL.replace(old, new, 1), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("num_kv_heads = 2", "num_kv_heads = 0", "layer_groups[0].num_kv_heads"),  # the issue's
        ("num_heads = 4\nnum_kv", "num_heads = 0\nnum_kv", "layer_groups[0].num_heads"),
        ("head_dim = 64", "head_dim = 0", "layer_groups[0].head_dim"),
        ("head_dim = 64", "head_dim_k = 0", "layer_groups[0].head_dim_k"),
        ("layers = 4\nnum_heads", "layers = 0\nnum_heads", "layer_groups[0].layers"),
        ("hidden_size = 256", "hidden_size = 0", "hidden_size"),
        ("num_layers = 4", "num_layers = 0", "num_layers"),
        ("num_attention_heads = 4", "num_attention_heads = 0", "num_attention_heads"),
        ("vocab_size = 1000", "vocab_size = 0", "vocab_size"),
        ("intermediate_size = 512", "intermediate_size = 0", "mlp_groups[0].intermediate_size"),
        ("head_dim = 64", "head_dim = nan", "layer_groups[0].head_dim"),
        ("hidden_size = 256", "hidden_size = inf", "hidden_size"),
        ("num_kv_heads = 2", "num_kv_heads = 3", "layer_groups[0].num_kv_heads"),  # 4 % 3
        ("num_kv_heads = 2", "num_kv_heads = 8", "layer_groups[0].num_kv_heads"),  # more KV heads
        ("head_dim = 64\n", "", "layer_groups[0].head_dim"),  # 256 // 4 = 64, fine: control
    ],
)
def test_model_refuses_zero_and_non_finite_counts(tmp_path: Path, old: str, new: str, field: str):
    path = _model(tmp_path, old, new)
    if new == "":
        assert load_model(path).layer_groups[0].head_dim_k == 64
        return
    with pytest.raises(ConfigError) as info:
        load_model(path)
    one_line(info, "m.toml", field)


def test_model_head_dim_derived_as_zero_is_refused(tmp_path: Path) -> None:
    path = _model(tmp_path, "hidden_size = 256", "hidden_size = 2")
    path = Path(path)
    path.write_text(path.read_text().replace("head_dim = 64\n", ""))
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    one_line(info, "layer_groups[0].head_dim")


# --- item 3 and 5: non-UTF-8 bytes and unreadable files in TOML inputs -------------------------


def test_profile_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(H100_TEXT.encode().replace(b"H100 SXM 80GB", b"H100 \xff\xfe SXM", 1))
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    one_line(info, "bad.toml:3", "not UTF-8", "0xff")


def test_model_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(MODEL.encode().replace(b"example/tiny", b"ex\xe9mple"))
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    one_line(info, "m.toml:3", "not UTF-8")


def test_profile_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.toml"
    path.write_text(H100_TEXT)
    deny_reading(monkeypatch, path)
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    one_line(info, "p.toml", "Permission denied")


def test_profile_and_model_directory_in_place_of_file(tmp_path: Path) -> None:
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    with pytest.raises(ConfigError) as info:
        load_profile(folder)
    one_line(info, "dir.toml", "directory")
    with pytest.raises(ConfigError) as info:
        load_model(str(folder))
    one_line(info, "dir.toml", "directory")


def test_model_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = Path(_model(tmp_path, "vocab_size = 1000", "vocab_size = 1000"))
    deny_reading(monkeypatch, path)
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    one_line(info, "m.toml", "Permission denied")


# --- item 7: a TP degree vLLM refuses -------------------------------------------------------


def test_tp_that_does_not_divide_heads_is_refused() -> None:
    spec = load_model("llama-3.1-8b")
    with pytest.raises(ConfigError) as info:
        kv_bytes_per_token(spec, tp=3)  # the issue: reported 96 KiB per replica, truth 128 KiB
    one_line(info, "llama-3.1-8b", "tp=3", "valid tp: 1, 2, 4, 8, 16, 32")
    with pytest.raises(ConfigError):
        kv_bytes_per_block(spec, 16, tp=6)


def test_tp_rule_matches_vllm() -> None:
    """Query heads divide by tp; KV heads divide by tp, or tp is a multiple of them."""
    qwen = load_model("qwen2.5-0.5b")  # 14 query heads, 2 KV heads
    assert tp_degrees(qwen) == [1, 2, 14]  # 7 divides 14 but is no multiple of 2 KV heads
    with pytest.raises(ConfigError, match="not a multiple of layer group 0 num_kv_heads"):
        check_tp(qwen, 7)
    llama = load_model("llama-3.1-8b")  # 32 heads, 8 KV heads: tp 16 replicates each KV head
    assert kv_bytes_per_token(llama, tp=16) * 16 == 2 * kv_bytes_per_token(llama, tp=8) * 8


@pytest.mark.parametrize("name", model_names())
def test_every_accepted_tp_sizes_exactly(name: str) -> None:
    """Per replica, KV heads are counted whole: sharding never loses or invents bytes."""
    spec = load_model(name)
    base = kv_bytes_per_token(spec, tp=1)
    for tp in tp_degrees(spec):
        per_replica = kv_bytes_per_token(spec, tp=tp) * tp
        assert per_replica >= base - tp  # rounding only
        if not spec.is_mla and tp <= min(
            g.num_kv_heads for g in spec.layer_groups if g.kind in ("full", "sliding")
        ):
            assert per_replica == pytest.approx(base, abs=tp)


# --- item 8: tier capacity override without a unit ------------------------------------------


@pytest.mark.parametrize("text", ["1000", "1000 ", "1.5", "2e3"])
def test_tier_capacity_without_unit_is_refused(text: str) -> None:
    profile = load_profile("h100-sxm")
    with pytest.raises(ConfigError) as info:
        with_overrides(profile, capacities={"dram": text})
    message = one_line(info, "dram", "no unit")
    assert "GB" in message  # suggests one


def test_tier_capacity_with_unit_or_int_bytes() -> None:
    profile = load_profile("h100-sxm")
    assert with_overrides(profile, capacities={"dram": "1000GB"}).tier("dram").capacity_bytes == (
        10**12
    )
    assert with_overrides(profile, capacities={"dram": "4096B"}).tier("dram").capacity_bytes == 4096
    assert with_overrides(profile, capacities={"dram": 2**40}).tier("dram").capacity_bytes == 2**40
    for bad in ("0GB", "nanGB", "-1TB"):
        with pytest.raises(ConfigError):
            with_overrides(profile, capacities={"dram": bad})
    assert math.isfinite(profile.tier("dram").capacity_bytes)

"""The `kvsim size` report: what fits in HBM, and the weights-don't-fit error."""

import json
import re

import pytest

from kvsim.capacity import DEFAULT_ACTIVATION_RESERVE_BYTES, capacity_report, format_capacity
from kvsim.errors import ConfigError, KvsimError, UnknownNameError
from kvsim.models import load_model

GB = 10**9


def test_llama_8b_on_an_80gb_gpu() -> None:
    spec = load_model("llama-3.1-8b")
    report = capacity_report(spec, hbm_bytes_per_gpu=80 * GB)
    weights = 2 * spec.num_params
    capacity = int(80 * GB * 0.9) - weights - DEFAULT_ACTIVATION_RESERVE_BYTES
    assert report["weight_bytes_per_rank"] == weights
    assert report["kv_bytes_per_token_per_rank"] == 131_072
    assert report["kv_bytes_per_block_per_rank"] == 16 * 131_072
    assert report["kv_capacity_bytes_per_rank"] == capacity
    assert report["kv_blocks"] == capacity // (16 * 131_072)
    assert report["max_tokens"] == 16 * report["kv_blocks"]
    assert report["max_concurrent_sequences"] == capacity // (32_768 * 131_072) == 12
    assert "mla_overprovisioning" not in report
    json.dumps(report)  # JSON-serialisable as the CLI prints it


def test_reserve_and_utilization_move_the_capacity() -> None:
    spec = load_model("llama-3.1-8b")
    base = capacity_report(spec, hbm_bytes_per_gpu=80 * GB)
    no_reserve = capacity_report(spec, hbm_bytes_per_gpu=80 * GB, activation_reserve_bytes=0)
    gap = no_reserve["kv_capacity_bytes_per_rank"] - base["kv_capacity_bytes_per_rank"]
    assert gap == DEFAULT_ACTIVATION_RESERVE_BYTES
    lower = capacity_report(spec, hbm_bytes_per_gpu=80 * GB, gpu_memory_utilization=0.5)
    assert lower["kv_blocks"] < base["kv_blocks"]
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        capacity_report(spec, hbm_bytes_per_gpu=80 * GB, gpu_memory_utilization=1.5)


def test_weights_do_not_fit() -> None:
    with pytest.raises(KvsimError) as info:
        capacity_report(load_model("llama-3.1-405b"), hbm_bytes_per_gpu=80 * GB)
    message = str(info.value)
    assert message.startswith("llama-3.1-405b bf16 weights need 811.7 GB per rank at tp=1")
    assert "80 GB × 0.90" in message and "--tp" in message


def test_weights_fit_but_reserve_leaves_no_kv_room() -> None:
    with pytest.raises(KvsimError, match="no room for KV"):
        capacity_report(load_model("llama-3.1-70b"), hbm_bytes_per_gpu=80 * GB, tp=2)


def test_tensor_parallel_and_fp8_weights_make_405b_fit() -> None:
    report = capacity_report(
        load_model("llama-3.1-405b"), hbm_bytes_per_gpu=80 * GB, tp=8, weight_dtype="fp8"
    )
    assert report["kv_bytes_per_token_per_rank"] == 516_096 // 8
    assert report["kv_bytes_per_token_per_replica"] == 516_096
    assert report["kv_capacity_bytes_per_replica"] == 8 * report["kv_capacity_bytes_per_rank"]
    assert report["max_concurrent_sequences"] > 0


def test_mla_report_shows_exact_sizing_gain() -> None:
    report = capacity_report(
        load_model("deepseek-v3"), hbm_bytes_per_gpu=141 * GB, tp=8, weight_dtype="fp8"
    )
    assert report["mla_overprovisioning"] == pytest.approx(56.9, abs=0.05)
    assert report["kv_bytes_per_token_per_rank"] == 70_272
    exact, mha = (
        report["max_concurrent_sequences"],
        report["mha_equivalent_max_concurrent_sequences"],
    )
    assert exact > mha and report["extra_sequences_vs_mha"] == exact - mha
    json.dumps(report)


def test_sizes_without_a_gpu() -> None:
    report = capacity_report(load_model("jamba-v0.1"), hbm_bytes_per_gpu=None)
    assert report["kv_capacity_bytes_per_rank"] is None
    assert report["state_bytes_per_seq_per_rank"] == 28 * (3 * 8192 + 8192 * 16) * 2
    assert "-" in format_capacity(report)


def test_unknown_kv_dtype() -> None:
    with pytest.raises(UnknownNameError):
        capacity_report(load_model("llama-3.1-8b"), hbm_bytes_per_gpu=80 * GB, kv_dtype="fp4")


def test_format_is_an_aligned_table() -> None:
    report = capacity_report(
        load_model("deepseek-v3"), hbm_bytes_per_gpu=141 * GB, tp=8, weight_dtype="fp8"
    )
    text = format_capacity(report)
    lines = text.splitlines()
    assert lines[0].split() == ["model", "deepseek-v3"]
    value_columns = {re.match(r"^.*?\S\s{2,}", line).end() for line in lines}
    assert len(value_columns) == 1  # every value starts in the same column
    assert "56.9×" in text and "68.6 KiB" in text

"""Model catalog, parameter counts and exact KV sizing against published figures."""

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.errors import ConfigError, KvsimError, UnknownNameError
from kvsim.models import (
    KvDtype,
    attention_costs,
    kv_bytes_per_block,
    kv_bytes_per_token,
    kv_heads_per_rank,
    linear_flops_per_token,
    load_model,
    mha_equivalent_bytes_per_token,
    mla_overprovisioning,
    model_names,
    sequence_kv_bytes,
    tp_degrees,
    weight_bytes,
)

MiB = 2**20

# Published parameter counts (model cards / papers), in billions: (total, active, relative tol).
PUBLISHED_PARAMS = {
    "llama-3.1-8b": (8.03, 8.03, 0.005),
    "llama-3.1-70b": (70.6, 70.6, 0.005),
    "llama-3.1-405b": (405.9, 405.9, 0.005),
    "llama-3.2-1b": (1.24, 1.24, 0.01),
    "qwen2.5-0.5b": (0.49, 0.49, 0.02),
    "qwen2.5-72b": (72.7, 72.7, 0.005),
    "mistral-7b": (7.24, 7.24, 0.005),
    "mixtral-8x7b": (46.7, 12.9, 0.005),
    # DeepSeek reports 37 B activated; our count includes both embedding matrices (37.55 B).
    "deepseek-v3": (671.0, 37.0, 0.02),
    "gemma-2-27b": (27.2, 27.2, 0.005),
    "jamba-v0.1": (52.0, 12.0, 0.02),
}


def test_catalog_has_the_promised_models() -> None:
    names = model_names()
    assert set(PUBLISHED_PARAMS) <= set(names)
    for name in names:
        spec = load_model(name)
        assert spec.name == name
        assert "/" in spec.hf_config


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_counts_match_published(name: str) -> None:
    total_b, active_b, tol = PUBLISHED_PARAMS[name]
    spec = load_model(name)
    assert spec.num_params / 1e9 == pytest.approx(total_b, rel=tol)
    assert spec.active_params / 1e9 == pytest.approx(active_b, rel=tol)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama-3.1-8b", 131_072),
        ("llama-3.1-70b", 327_680),
        ("llama-3.1-405b", 516_096),
        ("qwen2.5-72b", 327_680),
        ("mistral-7b", 131_072),
        ("mixtral-8x7b", 131_072),
        ("deepseek-v3", 70_272),
        ("gemma-2-27b", 46 * 16 * 256 * 2),
        ("jamba-v0.1", 4 * 8 * 256 * 2),
        ("llama-3.2-1b", 16 * 8 * 128 * 2),
    ],
)
def test_bf16_bytes_per_token(name: str, expected: int) -> None:
    spec = load_model(name)
    assert kv_bytes_per_token(spec) == expected
    assert kv_bytes_per_block(spec, 16) == 16 * expected


def test_tensor_parallel_shards_then_replicates_kv_heads() -> None:
    spec = load_model("llama-3.1-70b")
    assert kv_bytes_per_token(spec, tp=8) == 40_960
    assert kv_heads_per_rank(8, 16) == 1
    assert kv_bytes_per_token(spec, tp=16) == 40_960  # one replicated head per rank
    assert kv_bytes_per_token(spec, tp=2) == 163_840


def test_mla_latent_is_replicated_on_every_rank() -> None:
    spec = load_model("deepseek-v3")
    assert {kv_bytes_per_token(spec, tp=tp) for tp in (1, 2, 8, 16)} == {70_272}


def test_mla_overprovisioning() -> None:
    spec = load_model("deepseek-v3")
    assert mla_overprovisioning(spec) == pytest.approx(56.9, abs=0.05)
    assert mha_equivalent_bytes_per_token(spec) == 61 * 2 * 128 * 128 * 2
    assert mha_equivalent_bytes_per_token(spec, tp=8) == 61 * 2 * 16 * 128 * 2
    assert mla_overprovisioning(load_model("llama-3.1-8b")) == 1.0


def test_sliding_window_caps_a_long_sequence() -> None:
    spec = load_model("mistral-7b")
    held = sequence_kv_bytes(spec, 32_768)
    # Window-worth (4096 tokens × 128 KiB = 512 MiB), plus at most one partly used block per layer.
    assert 512 * MiB <= held <= 512 * MiB + kv_bytes_per_block(spec, 16)
    assert held == (4096 // 16 + 1) * kv_bytes_per_block(spec, 16)
    assert held < sequence_kv_bytes(load_model("llama-3.1-8b"), 32_768) / 7
    # Within the window nothing is capped.
    assert sequence_kv_bytes(spec, 1000) == 63 * kv_bytes_per_block(spec, 16)
    # vLLM's worst case during a 2048-token prefill chunk: cdiv(4095 + 2048, 16) + 1 blocks.
    chunked = sequence_kv_bytes(spec, 32_768, max_num_batched_tokens=2048)
    assert chunked == (-(-6143 // 16) + 1) * kv_bytes_per_block(spec, 16)


def test_gemma2_has_local_and_global_groups() -> None:
    spec = load_model("gemma-2-27b")
    kinds = {g.kind: g for g in spec.layer_groups}
    assert kinds["sliding"].layers == kinds["full"].layers == 23
    assert kinds["sliding"].window == 4096
    assert kinds["full"].head_dim_k == 128 and kinds["full"].num_kv_heads == 16
    per_layer_token = 16 * 256 * 2
    expected = 23 * per_layer_token * (32_768 + 257 * 16)
    assert sequence_kv_bytes(spec, 32_768) == expected
    windows = sorted((c.window or 0) for c in attention_costs(spec))
    assert windows == [0, 4096]


def test_hybrid_keeps_fixed_mamba_state() -> None:
    spec = load_model("jamba-v0.1")
    state = 28 * (3 * 8192 + 8192 * 16) * 2
    assert sequence_kv_bytes(spec, 0) == state
    assert sequence_kv_bytes(spec, 1600) == state + 100 * kv_bytes_per_block(spec, 16)
    assert sequence_kv_bytes(spec, 0, tp=2) == state // 2
    linear = [c for c in attention_costs(spec) if c.kind == "linear"]
    assert linear[0].state_bytes_per_seq == state
    assert linear[0].kv_bytes_per_token == 0 and linear[0].flops_per_token_pair == 0


@pytest.mark.parametrize(
    ("dtype", "llama_8b", "deepseek"),
    [
        ("bf16", 131_072, 70_272),
        ("fp16", 131_072, 70_272),
        ("fp8", 65_536, 35_136),
        ("int8", 32 * 8 * (256 + 8), 61 * (576 + 4)),
        ("int4", 32 * 8 * (128 + 8), 61 * (288 + 4)),
    ],
)
def test_kv_dtypes_and_scale_overhead(dtype: str, llama_8b: int, deepseek: int) -> None:
    assert kv_bytes_per_token(load_model("llama-3.1-8b"), dtype) == llama_8b
    assert kv_bytes_per_token(load_model("deepseek-v3"), dtype) == deepseek


def test_fp8_ds_mla_layout_and_custom_dtype() -> None:
    assert kv_bytes_per_token(load_model("deepseek-v3"), "fp8_ds_mla") == 61 * 656
    with pytest.raises(KvsimError, match="MLA"):
        kv_bytes_per_token(load_model("llama-3.1-8b"), "fp8_ds_mla")
    with pytest.raises(UnknownNameError, match="int8"):
        kv_bytes_per_token(load_model("llama-3.1-8b"), "fp4")
    per_block_fp32_scale = KvDtype("int8-pb", 1, scale_bytes=0)
    assert kv_bytes_per_token(load_model("llama-3.1-8b"), per_block_fp32_scale) == 65_536


def test_weights_and_linear_flops() -> None:
    spec = load_model("llama-3.1-8b")
    assert weight_bytes(spec) == 2 * spec.num_params
    assert weight_bytes(spec, "fp8", tp=8) == -(-spec.num_params // 8)
    untied_lookup = spec.vocab_size * spec.hidden_size
    assert linear_flops_per_token(spec) == 2 * (spec.num_params - untied_lookup)
    assert linear_flops_per_token(spec, tp=4) == linear_flops_per_token(spec) / 4
    tied = load_model("llama-3.2-1b")
    assert linear_flops_per_token(tied) == 2 * tied.active_params
    moe = load_model("mixtral-8x7b")
    assert linear_flops_per_token(moe) < 0.3 * 2 * moe.num_params


def test_attention_costs() -> None:
    (cost,) = attention_costs(load_model("llama-3.1-70b"), tp=8)
    assert cost.layers == 80 and cost.window is None
    assert cost.kv_bytes_per_token == 40_960
    assert cost.flops_per_token_pair == 80 * 8 * 2 * 256
    (mla,) = attention_costs(load_model("deepseek-v3"))
    assert mla.flops_per_token_pair == 61 * 128 * 2 * (2 * 512 + 64)
    assert mla.prefill_flops_per_token_pair == 61 * 128 * 2 * (128 + 64 + 128)
    assert mla.kv_bytes_per_token == 70_272


def _toml(tmp_path: Path, body: str, name: str = "m.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


BASE = """
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
{extra}

[[mlp_groups]]
layers = 4
intermediate_size = 512
"""


def test_load_from_path_and_kv_sharing(tmp_path: Path) -> None:
    plain = load_model(str(_toml(tmp_path, BASE.format(extra=""))))
    assert plain.layer_groups[0].head_dim_k == 64
    assert kv_bytes_per_token(plain) == 4 * 2 * 128 * 2
    shared = load_model(str(_toml(tmp_path, BASE.format(extra="kv_sharing_factor = 2"), "s.toml")))
    assert kv_bytes_per_token(shared) == kv_bytes_per_token(plain) // 2
    assert shared.num_params == plain.num_params - 2 * 256 * 2 * 2 * 64


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_model("llama-9")
    assert "llama-3.1-8b" in str(info.value) and "deepseek-v3" in str(info.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (BASE.format(extra="").replace("hidden_size = 256\n", ""), "hidden_size"),
        (BASE.format(extra="").replace("num_layers = 4", 'num_layers = "4"'), "num_layers"),
        (BASE.format(extra="").replace('kind = "full"', 'kind = "dense"'), "layer_groups[0].kind"),
        (BASE.format(extra='kind2 = "x"'), "layer_groups[0].kind2"),
        (
            BASE.format(extra="").replace("layers = 4\nnum_heads", "layers = 3\nnum_heads"),
            "layer_groups",
        ),
        (BASE.format(extra="").replace("num_kv_heads = 2", ""), "layer_groups[0].num_kv_heads"),
        (
            BASE.format(extra="").replace("intermediate_size = 512", ""),
            "mlp_groups[0].intermediate_size",
        ),
        ("name = [", "not valid TOML"),
    ],
)
def test_malformed_file_names_file_and_field(tmp_path: Path, body: str, field: str) -> None:
    path = _toml(tmp_path, body, "broken.toml")
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    assert str(path) in str(info.value) and field in str(info.value)


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_model(str(tmp_path / "nope.toml"))


def test_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_model("llama-3.1-8b").hidden_size = 1  # type: ignore[misc]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(
        ["mistral-7b", "gemma-2-27b", "jamba-v0.1", "deepseek-v3", "qwen2.5-0.5b"]
    ),
    a=st.integers(0, 200_000),
    b=st.integers(0, 200_000),
    block=st.sampled_from([1, 16, 32, 256]),
)
def test_sequence_bytes_monotone_in_context(name: str, a: int, b: int, block: int) -> None:
    spec = load_model(name)
    lo, hi = sorted((a, b))
    assert sequence_kv_bytes(spec, lo, block_size=block) <= sequence_kv_bytes(
        spec, hi, block_size=block
    )


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(model_names()),
    data=st.data(),
    context=st.integers(0, 100_000),
    dtype=st.sampled_from(["bf16", "fp8", "int8", "int4"]),
)
def test_more_tp_never_increases_per_rank_bytes(
    name: str, data: st.DataObject, context: int, dtype: str
) -> None:
    spec = load_model(name)
    degrees = st.sampled_from(tp_degrees(spec))  # the degrees vLLM accepts for this model
    lo, hi = sorted((data.draw(degrees), data.draw(degrees)))
    assert kv_bytes_per_token(spec, dtype, hi) <= kv_bytes_per_token(spec, dtype, lo)
    assert sequence_kv_bytes(spec, context, dtype, hi) <= sequence_kv_bytes(
        spec, context, dtype, lo
    )
    assert weight_bytes(spec, tp=hi) <= weight_bytes(spec, tp=lo)

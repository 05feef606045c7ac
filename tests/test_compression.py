"""KV compression: exact bytes against hand-computed values, invariants, parsing, the solver."""

import hashlib
import itertools
import json
import random
import re
from fractions import Fraction

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.cli import cli, main
from kvsim.compression import (
    PROFILES,
    LayerConfig,
    bytes_per_kept_token,
    choose,
    compressed_kv_bytes,
    compression_work,
    host_kv_bytes,
    kv_layer_count,
    parse_compression,
    quality,
    quality_reason,
)
from kvsim.compression.quality import _PUBLISHED, QualityPoint, quality_points
from kvsim.compression.solver import Option, load_sensitivity, option_cost, solve
from kvsim.errors import ConfigError, KvsimError, UnknownNameError
from kvsim.models import kv_bytes_per_token, load_model, model_names, tp_degrees

LLAMA8 = load_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128 dims: 131,072 B/token bf16


# -- bytes against hand-computed values -----------------------------------------------------------
def test_quant_4bit_group128_llama8b_by_hand():
    # per head per token: K 128 × 4 bits = 64 B + one fp16 scale + one fp16 zero (4 B), V same
    per_token = 32 * 8 * 2 * (64 + 4)
    assert per_token == 34_816
    comp = parse_compression("quant:k=4,v=4,group=128,residual=0")
    assert bytes_per_kept_token(LLAMA8, comp) == per_token
    assert compressed_kv_bytes(LLAMA8, comp, 32_768) == 32_768 * 34_816


def test_quant_kivi_defaults_keep_a_full_precision_residual():
    # group 32: 4 groups × 4 B per 128-dim vector; the last 128 tokens stay bf16
    comp = parse_compression("quant:k=4,v=4")
    assert comp.label == "quant:group=32,k=4,residual=128,v=4"
    packed = 32 * 8 * 2 * (64 + 16)
    assert bytes_per_kept_token(LLAMA8, comp) == packed == 40_960
    expected = 128 * 131_072 + (32_768 - 128) * 40_960
    assert compressed_kv_bytes(LLAMA8, comp, 32_768) == expected == 1_353_711_616
    # shorter than the residual: nothing is quantised yet
    assert compressed_kv_bytes(LLAMA8, comp, 100) == 100 * 131_072


def test_streaming_4_sinks_1024_window_at_32k():
    comp = parse_compression("streaming:sinks=4,window=1024")
    assert comp.kept_tokens(32_768) == 1_028
    assert compressed_kv_bytes(LLAMA8, comp, 32_768) == 1_028 * 131_072 == 134_742_016
    assert compressed_kv_bytes(LLAMA8, comp, 1_000) == 1_000 * 131_072  # under the cap
    assert bytes_per_kept_token(LLAMA8, comp) == 131_072


def test_h2o_ratio_and_absolute_budgets():
    comp = parse_compression("h2o:budget=0.2")
    assert comp.label == "h2o:budget=0.2,recent=0.1"  # H2O's equal split by default
    assert comp.kept_tokens(32_768) == 6_554  # ceil(6553.6)
    assert compressed_kv_bytes(LLAMA8, comp, 32_768) == 6_554 * 131_072
    tokens = parse_compression("h2o:budget=512,recent=128")
    assert tokens.kept_tokens(32_768) == 512
    assert tokens.kept_tokens(300) == 300


def test_snapkv_keeps_k_plus_w_plus_generated():
    comp = parse_compression("snapkv:window=32,capacity=1024")
    # prompt 32,768 compressed to 1,024 (992 voted + 32 window), then 100 generated tokens kept
    assert comp.kept_tokens(32_868, generated_tokens=100) == 1_124
    assert comp.kept_tokens(500) == 500  # short prompts are not compressed
    assert compressed_kv_bytes(LLAMA8, comp, 32_868, generated_tokens=100) == 1_124 * 131_072


def test_ratios_are_exact_fractions():
    # 0.15 × 100 is 15.000000000000002 in binary floating point; the profile must say 15
    assert parse_compression("lkv:ratio=0.15").kept_tokens(100) == 15
    assert parse_compression("kvp:budget=15%").kept_tokens(100) == 15


def test_lkv_per_layer_list_by_hand():
    ratios = "/".join(["0.1"] * 16 + ["0.3"] * 16)
    comp = parse_compression(f"lkv:ratio={ratios}")
    assert comp.kept_tokens(1000, 0) == 100
    assert comp.kept_tokens(1000, 31) == 300
    assert comp.kept_tokens(1000) == 200  # mean over layers
    assert compressed_kv_bytes(LLAMA8, comp, 1000) == 16 * 4096 * (100 + 300)
    assert bytes_per_kept_token(LLAMA8, comp) == pytest.approx(131_072)
    with pytest.raises(ConfigError, match="32 KV layers"):
        compressed_kv_bytes(LLAMA8, parse_compression("lkv:ratio=0.1/0.2"), 1000)


def test_moe_nd_layers_by_hand():
    comp = parse_compression("moe-nd:layers=0.5x4x2*16/1.0x16x16*16")
    # layers 0-15: K 4-bit (64 B + 4 groups × 4 B = 80), V 2-bit (32 + 16 = 48), 8 heads
    # layers 16-31: plain bf16, 8 × 512 = 4096 B per token
    low, high = 8 * (80 + 48), 8 * 512
    assert compressed_kv_bytes(LLAMA8, comp, 1000) == 16 * 500 * low + 16 * 1000 * high
    assert compressed_kv_bytes(LLAMA8, comp, 1000) == 73_728_000
    # bytes per kept token weights each layer by its keep share (0.5 and 1.0 around 0.75)
    expected = 16 * (0.5 / 0.75) * low + 16 * (1 / 0.75) * high
    assert bytes_per_kept_token(LLAMA8, comp) == pytest.approx(expected)


def test_mla_latent_quantised_as_one_vector():
    ds = load_model("deepseek-v3")
    comp = parse_compression("quant:k=4,v=4,group=128,residual=0")
    # 576-element latent: 288 B + ceil(576/128) = 5 groups × 4 B, in each of 61 layers
    assert bytes_per_kept_token(ds, comp) == 61 * (288 + 20) == 18_788
    assert kv_bytes_per_token(ds) == 61 * 576 * 2


def test_sliding_layers_window_cap():
    gemma = load_model("gemma-2-27b")  # 23 sliding (window 4096) + 23 full, 16 KV heads × 256 dims
    comp = parse_compression("h2o:budget=0.9")
    per_layer = 16 * 256 * 2
    assert compressed_kv_bytes(gemma, comp, 8000) == 46 * 7200 * per_layer
    capped = compressed_kv_bytes(gemma, comp, 8000, window_cap=True)
    assert capped == 23 * 7200 * per_layer + 23 * 4096 * per_layer


def test_linear_layers_carry_no_per_token_kv():
    jamba = load_model("jamba-v0.1")  # 4 attention layers of 32 carry KV
    assert kv_layer_count(jamba) == 4 and kv_layer_count(LLAMA8) == 32
    comp = parse_compression("quant:k=2,v=2,group=128,residual=0")
    assert bytes_per_kept_token(jamba, comp) == 4 * 8 * 2 * (32 + 4)
    with pytest.raises(ConfigError, match="4 KV layers"):
        compressed_kv_bytes(jamba, parse_compression("lkv:ratio=0.1/0.2"), 10)


def test_quantisation_never_widens_the_base_dtype():
    # 8-bit groups of 128 with 4 B of scales cost 132 B per vector; int8 costs 128 + one fp32
    # scale = 132 B: not narrower, so the base is kept; 16-bit into fp8 is the fp8 base
    assert bytes_per_kept_token(LLAMA8, parse_compression("quant:k=8,v=8,group=128"), "int8") == (
        kv_bytes_per_token(LLAMA8, "int8")
    )
    assert bytes_per_kept_token(LLAMA8, parse_compression("quant:k=16,v=16"), "fp8") == (
        kv_bytes_per_token(LLAMA8, "fp8")
    )


def test_infinigen_keeps_partial_keys_on_gpu_and_fetches_a_budget():
    comp = parse_compression("infinigen:budget=0.2,partial=0.2")
    assert comp.offloaded and comp.drops_tokens
    # partial keys: ceil(0.2 × 128) = 26 dims × 2 B × 8 heads × 32 layers per token
    assert bytes_per_kept_token(LLAMA8, comp) == 26 * 2 * 8 * 32 == 13_312
    assert comp.kept_tokens(10_000) == 10_000
    assert comp.read_tokens(10_000) == 2_000
    assert compressed_kv_bytes(LLAMA8, comp, 10_000) == 10_000 * 13_312
    assert host_kv_bytes(LLAMA8, comp, 10_000) == 10_000 * 131_072
    work = compression_work(LLAMA8, comp)
    assert work.host_bytes_per_read_token == 131_072
    assert work.speculate_flops_per_context_token == 32 * 32 * 2 * 26


def test_none_is_the_uncompressed_size_everywhere():
    comp = parse_compression("none")
    assert comp.salt == 0 and not comp.drops_tokens
    for name in ("llama-3.1-8b", "deepseek-v3", "gemma-2-27b", "jamba-v0.1"):
        spec = load_model(name)
        assert compressed_kv_bytes(spec, comp, 12_345) == 12_345 * kv_bytes_per_token(spec)


def test_work_by_hand():
    snap = compression_work(LLAMA8, parse_compression("snapkv"))
    # 32 observation queries × every prompt key, 32 query heads × 128 dims × 2 FLOPs, 32 layers
    assert snap.score_flops_per_prompt_token == 32 * 32 * 2 * 32 * 128 == 8_388_608
    assert snap.select_items_per_prompt_token == 32 * 8
    quant = compression_work(LLAMA8, parse_compression("quant:k=4,v=4,group=128,residual=0"))
    # read 4096 B of bf16 K,V per layer, write 8 × 136 packed B
    assert quant.quant_bytes_per_token == 32 * (4096 + 1088)
    assert quant.dequant_flops_per_read_token == 32 * 8 * 256 * 2
    assert quant.kv_read_bytes_per_read_token == 34_816
    h2o = compression_work(LLAMA8, parse_compression("h2o"))
    assert h2o.score_flops_per_read_token == 32 * 32
    with pytest.raises(ConfigError, match="choose a candidate"):
        compression_work(LLAMA8, parse_compression("auto"))


# -- compression never raises memory --------------------------------------------------------------
def _kv_layers(spec) -> int:
    return sum(g.kv_layers for g in spec.layer_groups)


_RATIO = st.sampled_from(["0.01", "0.05", "0.15", "0.2", "0.5", "0.999", "1.0", "30%"])
_BITS = st.integers(1, 16)


@st.composite
def _profile_text(draw, kv_layers: int) -> str:
    name = draw(st.sampled_from(sorted(set(PROFILES) - {"auto"})))
    if name == "none":
        return "none"
    if name == "streaming":
        return f"streaming:sinks={draw(st.integers(1, 64))},window={draw(st.integers(1, 5000))}"
    if name in ("h2o", "kvp"):
        budget = draw(st.one_of(_RATIO, st.integers(1, 10_000).map(str)))
        return f"{name}:budget={budget}"
    if name == "snapkv":
        window = draw(st.integers(1, 64))
        return f"snapkv:window={window},capacity={window + draw(st.integers(1, 5000))}"
    if name == "lkv":
        if draw(st.booleans()):
            return f"lkv:ratio={draw(_RATIO)}"
        return "lkv:ratio=" + "/".join(draw(_RATIO) for _ in range(kv_layers))
    if name == "quant":
        group = draw(st.sampled_from([1, 8, 32, 64, 128, 4096]))
        residual = draw(st.integers(0, 300))
        return f"quant:k={draw(_BITS)},v={draw(_BITS)},group={group},residual={residual}"
    if name == "moe-nd":
        keeps = ["1.0", "0.5", "0.125", "0.3"]
        layers = "/".join(
            f"{draw(st.sampled_from(keeps))}x{draw(_BITS)}x{draw(_BITS)}" for _ in range(kv_layers)
        )
        return f"moe-nd:layers={layers},group={draw(st.sampled_from([16, 32, 128]))}"
    return f"infinigen:budget={draw(_RATIO)},partial={draw(_RATIO)}"


@st.composite
def _case(draw):
    spec = load_model(draw(st.sampled_from(model_names())))
    dtypes = ["bf16", "fp16", "fp8", "int8", "int4"] + (["fp8_ds_mla"] if spec.is_mla else [])
    context = draw(st.integers(0, 200_000))
    generated = draw(st.integers(0, context))
    return (
        spec,
        draw(_profile_text(_kv_layers(spec))),
        draw(st.sampled_from(dtypes)),
        draw(st.sampled_from(tp_degrees(spec))),
        context,
        generated,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_compression_never_raises_memory(case):
    spec, text, dtype, tp, context, generated = case
    comp = parse_compression(text)
    plain = context * kv_bytes_per_token(spec, dtype, tp)
    packed = compressed_kv_bytes(spec, comp, context, dtype, tp, generated_tokens=generated)
    assert 0 <= packed <= plain
    assert bytes_per_kept_token(spec, comp, dtype, tp) <= kv_bytes_per_token(spec, dtype, tp)
    for layer in (None, 0):
        assert 0 <= comp.read_tokens(context, layer, generated) <= context
        assert (
            comp.read_tokens(context, layer, generated)
            <= comp.kept_tokens(context, layer, generated)
            or comp.name == "infinigen"
        )
        assert comp.kept_tokens(context, layer, generated) <= context
    # the canonical label parses back to the same profile
    again = parse_compression(comp.label)
    assert again == comp and again.salt == comp.salt


# -- labels, salts, parse errors ------------------------------------------------------------------
def test_same_config_same_label_and_a_stable_salt():
    a = parse_compression("quant:v=4,k=4")
    b = parse_compression("quant: k=4 , v=4 ,group=32,residual=128")
    assert a == b and a.label == b.label
    digest = hashlib.blake2b(a.label.encode(), digest_size=8).digest()
    assert a.salt == int.from_bytes(digest, "big") >> 2
    assert 0 < a.salt < 2**62
    labels = {
        parse_compression(t).salt
        for t in ("h2o", "snapkv", "quant", "streaming", "kvp", "lkv", "infinigen")
    }
    assert len(labels) == 7


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("quant:k=4,bits=3", "unknown key 'bits'; valid keys: group, k, residual, v"),
        ("quant:k=0", "k='0': expected an integer 1-16"),
        ("quant:k=four", "k='four'"),
        ("h2o:budget=1.5", "budget='1.5': expected a ratio in (0, 1]"),
        ("h2o:budget=0", "budget='0'"),
        ("h2o:budget=0.1,recent=0.2", "recent=0.2 exceeds budget=0.1"),
        ("snapkv:window=64,capacity=64", "capacity=64 must exceed window=64"),
        ("streaming:sinks", "'sinks' is not key=value"),
        ("streaming:sinks=4,sinks=8", "key 'sinks' given twice"),
        ("lkv:ratio=0.1/x", "ratio='x'"),
        ("moe-nd", "exactly one of table=PATH, budget=RATIO"),
        ("moe-nd:layers=1.0x4", "layers='1.0x4'"),
        ("moe-nd:budget=0.0001", "below the cheapest configuration"),
        ("none:k=4", "takes no keys"),
        ("auto:none|auto", "cannot itself be auto"),
        ("", "expected NAME[:key=value,...]"),
    ],
)
def test_parse_errors_are_one_line_and_name_the_key(text, needle):
    with pytest.raises(ConfigError) as err:
        parse_compression(text)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("h2o:budget=12.5%", "h2o:budget=0.125,recent=0.0625"),
        ("kvp:budget=1.", "kvp:budget=1.0"),
        ("kvp:budget=.5", "kvp:budget=0.5"),
        ("lkv:ratio=0.1234567890123456789", "lkv:ratio=0.1234567890123456789"),
    ],
)
def test_ratio_labels_are_exact_decimals(text, label):
    comp = parse_compression(text)
    assert comp.label == label
    assert parse_compression(label) == comp


@pytest.mark.parametrize(
    "text", ["h2o:budget=1e-1", "h2o:budget=-0.1", "lkv:ratio=1/3", "kvp:budget=0.2.1"]
)
def test_ratios_must_be_plain_decimals(text):
    with pytest.raises(ConfigError, match="expected"):
        parse_compression(text)


def test_moe_nd_table_and_key_errors(tmp_path):
    third = tmp_path / "third.csv"
    third.write_text("layer,keep,kbits,vbits\n0,1/3,4,4\n")
    with pytest.raises(ConfigError, match="row 1: keep must be a decimal"):
        parse_compression(f"moe-nd:table={third}")
    gap = tmp_path / "gap.csv"
    gap.write_text("layer,keep,kbits,vbits\n0,1.0,4,4\n2,1.0,4,4\n")
    with pytest.raises(ConfigError, match=r"numbered 0\.\.L-1"):
        parse_compression(f"moe-nd:table={gap}")
    with pytest.raises(ConfigError, match="n_layers= sizes the synthetic table"):
        parse_compression("moe-nd:layers=1.0x4x4,n_layers=4")
    with pytest.raises(ConfigError, match=r"missing\.csv"):
        parse_compression(f"moe-nd:table={tmp_path / 'missing.csv'}")
    assert len(parse_compression("moe-nd:budget=0.25,n_layers=80").layer_configs) == 80


def test_unknown_profile_lists_the_valid_ones():
    with pytest.raises(UnknownNameError) as err:
        parse_compression("zip:level=9")
    message = str(err.value)
    assert "zip" in message and "\n" not in message
    for name in PROFILES:
        assert name in message


def test_auto_candidates_parse_in_order():
    comp = parse_compression("auto:none|quant:k=4,v=4|h2o:budget=0.1")
    assert [c.name for c in comp.candidates] == ["none", "quant", "h2o"]
    assert comp.label == "auto:none|quant:group=32,k=4,residual=128,v=4|h2o:budget=0.1,recent=0.05"
    assert len(parse_compression("auto").candidates) >= 3


# -- MoE-nD solver against brute force ------------------------------------------------------------
def _brute_force(table, limit):
    best = None
    for pick in itertools.product(*(range(len(o)) for o in table)):
        cost = sum(option_cost(table[layer][i].config) for layer, i in enumerate(pick))
        if cost <= limit + 1e-9:
            loss = sum(table[layer][i].loss for layer, i in enumerate(pick))
            best = loss if best is None else min(best, loss)
    return best


def _convex_layer(rng, keeps):
    """Options at 16/16 bits (cost = keep) with loss increasing at increasing rates."""
    rates = sorted(rng.uniform(0.1, 5.0) for _ in keeps[1:])
    losses, loss = [0.0], 0.0
    for (prev, keep), rate in zip(itertools.pairwise(keeps), rates, strict=True):
        loss += rate * float(prev - keep)
        losses.append(loss)
    return tuple(Option(LayerConfig(k, 16, 16), x) for k, x in zip(keeps, losses, strict=True))


@pytest.mark.parametrize("seed", range(12))
def test_solver_equals_brute_force_on_convex_equal_step_instances(seed):
    # equal byte steps + convex losses: greedy by marginal loss is exactly optimal
    rng = random.Random(seed)
    layers, options = rng.choice([3, 4]), rng.choice([3, 4])
    keeps = [Fraction(options - i, options) for i in range(options)]
    table = tuple(_convex_layer(rng, keeps) for _ in range(layers))
    budget = Fraction(rng.randint(layers, layers * options), layers * options)
    got = solve(table, budget)
    assert got.cost <= float(budget) * layers + 1e-9
    assert got.loss == pytest.approx(_brute_force(table, float(budget) * layers))


@pytest.mark.parametrize("seed", range(12))
def test_solver_is_optimal_at_its_own_cost_on_convex_instances(seed):
    # unequal steps: greedy stops at a Lagrangian point, optimal for the cost it reaches
    rng = random.Random(100 + seed)
    layers, options = rng.choice([3, 4]), rng.choice([3, 4])
    table = []
    for _ in range(layers):
        cuts = sorted({Fraction(rng.randint(1, 99), 100) for _ in range(options - 1)}, reverse=True)
        table.append(_convex_layer(rng, [Fraction(1), *cuts]))
    table = tuple(table)
    cheapest = sum(min(option_cost(o.config) for o in opts) for opts in table) / layers
    budget = rng.uniform(cheapest, 1.0)
    got = solve(table, budget)
    assert got.cost <= float(budget) * layers + 1e-9
    assert got.loss == pytest.approx(_brute_force(table, got.cost))


@pytest.mark.parametrize("seed", range(12))
def test_solver_is_feasible_and_never_beats_brute_force_on_random_tables(seed):
    # arbitrary tables: greedy is a heuristic (docs/compression.md reports its gap)
    rng = random.Random(200 + seed)
    table = tuple(
        tuple(
            Option(
                LayerConfig(rng.choice(list(map(Fraction, ("1", "0.5", "0.25")))), kb, vb),
                rng.uniform(0, 10),
            )
            for kb, vb in rng.sample([(16, 16), (8, 8), (4, 4), (4, 2), (2, 2)], rng.choice([3, 4]))
        )
        for _ in range(rng.choice([3, 4]))
    )
    cheapest = sum(min(option_cost(o.config) for o in opts) for opts in table) / len(table)
    budget = rng.uniform(cheapest, 1.0)
    got = solve(table, budget)
    assert got.cost <= budget * len(table) + 1e-9
    assert got.loss >= _brute_force(table, budget * len(table)) - 1e-9


def test_sensitivity_files_csv_and_toml(tmp_path):
    rows = [
        ("0", "1.0", "16", "16", "0"),
        ("0", "0.5", "4", "4", "1"),
        ("1", "1.0", "16", "16", "0"),
        ("1", "0.5", "4", "4", "3"),
    ]
    csv_path = tmp_path / "sens.csv"
    csv_path.write_text("layer,keep,kbits,vbits,loss\n" + "\n".join(",".join(r) for r in rows))
    toml_path = tmp_path / "sens.toml"
    toml_path.write_text(
        "".join(
            f"[[option]]\nlayer = {a}\nkeep = {b}\nkbits = {c}\nvbits = {d}\nloss = {e}\n"
            for a, b, c, d, e in rows
        )
    )
    assert load_sensitivity(str(csv_path)) == load_sensitivity(str(toml_path))
    # budget 0.5 of 2 layers: 1.0 of 16-bit bytes; one layer must go to 0.5 × (4+1+4+1)/32
    comp = parse_compression(f"moe-nd:budget=0.6,sensitivity={csv_path}")
    assert comp.layer_configs == (
        LayerConfig(Fraction(1, 2), 4, 4),
        LayerConfig(Fraction(1), 16, 16),
    )
    table = tmp_path / "layers.csv"
    table.write_text("layer,keep,kbits,vbits\n0,0.5,4,4\n1,1.0,16,16\n")
    assert parse_compression(f"moe-nd:table={table}") == comp
    with pytest.raises(ConfigError, match="missing 'loss'"):
        bad = tmp_path / "bad.csv"
        bad.write_text("layer,keep,kbits,vbits\n0,1.0,16,16\n")
        parse_compression(f"moe-nd:budget=0.5,sensitivity={bad}")


# -- quality and auto -----------------------------------------------------------------------------
def test_quality_points_cite_a_source_or_say_none_was_found():
    assert quality(parse_compression("none")).retained == 1.0
    for text in ("kvp", "lkv", "infinigen", "quant:k=8,v=8", "snapkv:capacity=512"):
        comp = parse_compression(text)
        assert quality(comp) is None
        assert quality_reason(comp).startswith("no published number found for")
        assert "arXiv" in quality_reason(comp)
    moe = parse_compression("moe-nd:layers=0.5x4x4*32")  # 0.5 × 20/32: 3.2× compression
    assert quality(moe).source.startswith("MoE-nD, arXiv 2604.17695")
    harsh = parse_compression("moe-nd:layers=0.05x2x2*32")  # beyond 14×: no point
    assert quality(harsh) is None and "14x" in quality_reason(harsh)


def _published(text: str) -> QualityPoint:
    point = quality(parse_compression(text))
    assert point is not None, text
    return point


def test_quality_primary_points_are_the_published_numbers():
    # hand-copied from the papers' tables (docs/compression.md, "Quality")
    cases = [
        # profile, model, benchmark, compressed, full, source
        ("snapkv", "Llama-3-8B-Instruct", "LongBench average", 41.35, 41.46,
         "PyramidKV, arXiv 2406.02069, Table 1 and Appendix Table 11"),
        ("h2o:budget=128", "Llama-3-8B-Instruct", "LongBench average", 35.37, 41.46,
         "PyramidKV, arXiv 2406.02069, Appendix Table 11"),
        ("streaming:sinks=4,window=60", "Llama-3-8B-Instruct", "LongBench average", 30.43, 41.46,
         "PyramidKV, arXiv 2406.02069, Table 1 and Appendix Table 11"),
        ("quant:k=2,v=2", "Mistral-7B-Instruct-v0.2", "LongBench 15-task average", 42.43, 43.54,
         "KIVI, arXiv 2402.02750, official repo jy-yuan/KIVI docs/long_bench.md (commit 6ceef73), "
         "Table 2"),
        ("quant:k=4,v=4", "Mistral-7B-Instruct-v0.2", "LongBench 15-task average", 43.53, 43.54,
         "KIVI, arXiv 2402.02750, official repo jy-yuan/KIVI docs/long_bench.md (commit 6ceef73), "
         "Table 2"),
        ("quant:k=2,v=2,group=128", "Llama-2-13B", "GSM8K (LM-Eval)", 17.29, 22.67,
         "KIVI, arXiv 2402.02750, Table 5 (16-bit score from Table 3)"),
        ("h2o:budget=0.2", "OPT-30B", "COPA (lm-eval-harness, 5-shot per Sec. 5.1)", 84.00, 85.00,
         "H2O, arXiv 2306.14048, Table 2"),
        ("snapkv:capacity=4096,window=64", "Command-R (35B)",
         "modified Needle-in-a-Haystack, aggregate score", 9.819, 9.866,
         "SnapKV, arXiv 2404.14469, Table 2 (Sec. 5.4.1)"),
    ]  # fmt: skip
    for text, model, benchmark, score, full, source in cases:
        point = _published(text)
        assert (point.model, point.benchmark, point.source) == (model, benchmark, source), text
        assert (point.score, point.baseline) == (score, full), text
        assert point.retained == score / full, text
        assert "computed by kvsim" in point.note


def test_quality_points_lists_every_matching_table_row():
    h2o = {(p.benchmark.split(" ")[0], p.score, p.baseline) for p in quality_points(
        parse_compression("h2o"))}  # fmt: skip
    assert h2o == {
        ("COPA", 84.00, 85.00),
        ("OpenBookQA", 43.00, 43.20),
        ("PiQA", 78.45, 78.51),
        ("Winogrande", 69.06, 70.24),
    }
    snap = quality_points(parse_compression("snapkv:capacity=2048,window=32"))
    assert snap[0] == quality(parse_compression("snapkv"))  # primary first
    pairs = {(p.model, p.benchmark, p.score, p.baseline) for p in snap}
    assert ("Mistral-7B-Instruct", "LongBench average", 41.56, 42.71) in pairs
    assert ("Llama-3-70B-Instruct", "LongBench average", 46.36, 46.55) in pairs
    assert ("Mistral-7B-Instruct-v0.2", "LongBench GovReport", 28.81, 32.85) in pairs
    assert ("LWM-Text-Chat-1M", "LongBench GovReport", 21.6, 27.97) in pairs
    assert len(snap) == 8
    quant = {(p.model, p.benchmark.split(" (")[0], p.score, p.baseline)
             for p in quality_points(parse_compression("quant:k=2,v=2"))}  # fmt: skip
    assert ("Llama2-7B", "LongBench 8-task average", 44.27, 44.52) in quant
    assert ("Falcon-7B", "GSM8K", 3.41, 4.55) in quant
    assert ("LongChat-7b-v1.5-32K", "LongBench Qasper", 28.69, 29.42) in quant
    assert len(quant) == 21


def test_quality_budget_rule_is_plus_minus_ten_percent_of_the_published_size():
    near = _published("streaming")  # 4 + 2000 kept, published at 2048
    assert (near.score, near.baseline) == (37.82, 41.46)
    assert "published at KV 2048; this config keeps 2004" in near.note
    assert "nearest published point" in near.note
    assert "nearest" not in _published("streaming:sinks=4,window=2044").note
    # 2048 ± 204.8: 1844 and 2252 apply, 1843 and 2253 do not
    for capacity, applies in ((1843, False), (1844, True), (2252, True), (2253, False)):
        comp = parse_compression(f"snapkv:capacity={capacity}")
        assert (quality(comp) is not None) is applies, capacity
    for text in (
        "snapkv:capacity=1500",
        "h2o:budget=1000",
        "h2o:budget=0.3",
        "streaming:window=500",
    ):
        comp = parse_compression(text)
        assert quality(comp) is None and quality_points(comp) == []
        reason = quality_reason(comp)
        assert reason.startswith("no published number found") and "±10 %" in reason, text
    # a token budget never takes a ratio point, nor the reverse
    assert {p.source for p in quality_points(parse_compression("h2o:budget=0.2"))} == {
        "H2O, arXiv 2306.14048, Table 2"
    }
    assert all("H2O, arXiv" not in p.source
               for p in quality_points(parse_compression("h2o:budget=2048")))  # fmt: skip
    # SnapKV's own tables state the window; PyramidKV's do not
    assert quality_points(parse_compression("snapkv:capacity=1024,window=64")) == []
    wide = quality_points(parse_compression("snapkv:capacity=2048,window=64"))
    assert {p.source.split(",")[0] for p in wide} == {"PyramidKV"} and len(wide) == 3


def test_quality_quant_matches_bits_group_and_residual_exactly():
    for text in ("quant:k=4,v=2", "quant:k=2,v=2,residual=0", "quant:k=4,v=4,group=64",
                 "quant:k=3,v=3", "quant:k=8,v=8"):  # fmt: skip
        comp = parse_compression(text)
        assert quality(comp) is None, text
        assert "KIVI (arXiv 2402.02750)" in quality_reason(comp)
    assert _published("quant:k=2,v=2,group=64").score == 21.00


def test_quality_streaming_arc_point_has_no_full_kv_baseline():
    point = _published("streaming:sinks=4,window=1020")  # cache 1024: StreamingLLM Table 5
    assert (point.model, point.score, point.baseline, point.retained) == (
        "Llama-2-7B-Chat", 71.34, None, None)  # fmt: skip
    assert point.source == "StreamingLLM, arXiv 2309.17453, Table 5"
    assert "one-shot" in point.note and "71.25" in point.note
    assert len(quality_points(parse_compression("streaming:sinks=4,window=1020"))) == 6


def test_every_profile_has_a_cited_point_or_a_reason():
    defaults = {"moe-nd": "moe-nd:layers=0.5x4x4*32"}
    for name in PROFILES:
        comp = parse_compression(defaults.get(name, name))
        points = quality_points(comp)
        assert (quality(comp) is None) == (points == [])
        if name != "none":
            assert all("arXiv " in p.source for p in points), name
        assert quality_reason(comp).strip(), name
        if not points:
            assert quality_reason(comp).startswith("no published number found"), name
    for pub in _PUBLISHED:
        assert re.search(r"arXiv \d{4}\.\d{5}", pub.source), pub
        assert pub.score and (pub.baseline is None or float(pub.baseline) > 0)


def test_choose_picks_the_best_fitting_candidate_else_the_smallest():
    a, b, c = (parse_compression(t) for t in ("none", "quant:k=4,v=4", "h2o"))
    size = {a: 100, b: 40, c: 20}
    latency = {a: 1.0, b: 0.5, c: 0.4}
    rank = {a: 1.0, b: None, c: 0.9}

    def pick(lat_budget, mem_budget):
        return choose(
            [a, b, c],
            1000,
            latency.__getitem__,
            lat_budget,
            mem_budget,
            size.__getitem__,
            rank.__getitem__,
        )

    assert pick(2.0, 1000) is a  # everything fits: highest quality
    assert pick(0.9, 1000) is c  # none is too slow; h2o ranks above an unpublished quant
    assert pick(0.45, 30) is c
    assert pick(0.1, 1000) is c  # nothing fits: fewest bytes
    assert pick(0.6, 30) is c
    assert choose([b], 10, lambda _: 9.0, 1.0, 1, lambda _: 5) is b


# -- kvsim size --compression ---------------------------------------------------------------------
def test_cli_size_prints_the_compressed_size():
    result = CliRunner().invoke(
        cli, ["size", "--model", "llama-3.1-8b", "--compression", "quant:k=4,v=4"]
    )
    assert result.exit_code == 0, result.output
    assert "quant:group=32,k=4,residual=128,v=4" in result.output
    assert "1,353,711,616 B" in result.output  # hand-computed above
    result = CliRunner().invoke(
        cli,
        [
            "size",
            "--model",
            "llama-3.1-8b",
            "--compression",
            "streaming:sinks=4,window=1024",
            "--json",
        ],
    )
    report = json.loads(result.output)["compression"]
    assert report["sequence_kv_bytes_per_rank"] == 134_742_016
    assert report["compression_ratio"] == pytest.approx(32_768 / 1_028)


def test_cli_size_bad_compression_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["size", "--model", "llama-3.1-8b", "--compression", "quant:k=4,bits=3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown key 'bits'" in err


def test_kvsim_error_family():
    assert issubclass(ConfigError, KvsimError)

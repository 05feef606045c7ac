"""Engine profiles (kvsim.engines): the shipped files, the registry, and what each profile does
to the price of an iteration, checked against hand-worked closed forms."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from kvsim.costmodel import make_cost_model
from kvsim.costmodel.breakdown import SHAPES, iteration_breakdown
from kvsim.engine.config import EngineConfig
from kvsim.engine.resolve import resolve_engine
from kvsim.engines import DEFAULT_ENGINE, EngineProfile, engine_names, load_engine
from kvsim.errors import ConfigError, KvsimError
from kvsim.hardware import load_profile
from kvsim.hardware.profile import AllReduceAlgorithm, EngineKernels
from kvsim.models import load_model

LLAMA_7B = load_model("llama-2-7b")
# Llama-2-7B in bf16: 13,476,831,232 bytes of weights, less its untied embedding table (32,000 x
# 4,096 x 2 bytes = 262,144,000), which a decode step reads one row of: 13,214,687,232 bytes.
WEIGHT_BYTES = 13_214_687_232
HBM = 3.35e12  # H100 SXM
GEMMS = 32 * 4 + 1  # QKV, output, gate-up, down per layer, and the LM head
ELEMENTWISE = 5 * 32  # two norms, RoPE, activation, KV write per layer
ELEMENTWISE_BYTES = 6_307_840  # one token's activations through them, all layers (bf16)
KV_BYTES_PER_TOKEN = 32 * 2 * 4096 * 2  # layers x (K, V) x 32 heads x 128 x bf16 = 524,288


def _plain_h100(**engine_terms: float) -> object:
    """The shipped h100-sxm with round kernel terms: every rate at its datasheet peak, a sharp
    roofline, and fixed costs of 2 us per GEMM, 1 us per elementwise kernel, 5 us per attention
    layer; ``engine_terms`` become its [engines.test] table."""
    h100 = load_profile("h100-sxm")
    eff = dataclasses.replace(
        h100.efficiency,
        compute=1.0,
        memory=1.0,
        attention=1.0,
        elementwise=1.0,
        ridge_sharpness=float("inf"),
        kernel_floor_s=2e-6,
        attention_floor_s=5e-6,
        elementwise_floor_s=1e-6,
    )
    algorithms = (
        AllReduceAlgorithm("custom", 5e-6, 0.0, 100e9, max_bytes=8 * 2**20),
        AllReduceAlgorithm("nccl", 28e-6, 0.0, 350e9),
    )
    engines = {"test": EngineKernels(dict(engine_terms))} if engine_terms else {}
    return dataclasses.replace(h100, efficiency=eff, allreduce=algorithms, engines=engines)


def _engine(**changes: object) -> EngineProfile:
    return dataclasses.replace(load_engine("vllm@0.24"), kernels="test", **changes)


def _gpu_decode_step_s(context: int) -> float:
    """One decode step of one sequence with `context` tokens already cached, on `_plain_h100`:
    memory-bound everywhere at batch 1, so each kernel family is bytes / bandwidth + its fixed
    costs."""
    weights = WEIGHT_BYTES / HBM + GEMMS * 2e-6  # 3.9447 ms + 0.258 ms
    elementwise = ELEMENTWISE_BYTES / HBM + ELEMENTWISE * 1e-6  # 1.9 us + 0.160 ms
    attention = (context + 1) * KV_BYTES_PER_TOKEN / HBM + 32 * 5e-6  # reads and its new token
    return weights + elementwise + attention


def test_every_shipped_profile_loads_and_a_bare_name_is_the_current_version() -> None:
    names = engine_names()
    assert {"vllm", "sglang", "trtllm", "vllm@0.6", "sglang@0.3", "nim@1.8"} <= set(names)
    for name in names:
        profile = load_engine(name)
        assert profile.full_name.startswith(name.split("@")[0])
        assert set(profile.defaults) == {
            "max_num_seqs",
            "max_num_batched_tokens",
            "chunked_prefill",
            "kv_reservation",
            "num_scheduler_steps",
            "mixed_batches",
        }
    assert load_engine("vllm").full_name == "vllm@0.24"
    assert load_engine(DEFAULT_ENGINE).current
    assert EngineConfig().engine == DEFAULT_ENGINE


def test_unknown_engine_is_one_line_listing_the_names() -> None:
    with pytest.raises(KvsimError, match=r"unknown engine 'vllm@9'; valid: .*vllm@0\.24"):
        load_engine("vllm@9")


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("overlap_scheduling = true", "overlap_scheduling = 1", "overlap_scheduling"),
        ("iteration_overhead_s = 0.0015", "iteration_overhead_s = 1.5", "iteration_overhead_s"),
        ("max_num_seqs = 1024", "max_num_seqs = 0", "defaults.max_num_seqs"),
        ('kv_reservation = "prompt"', 'kv_reservation = "some"', "defaults.kv_reservation"),
        ('allreduce = ["custom", "nccl"]', 'allreduce = "custom"', "allreduce"),
        ("[defaults]", "[defaults]\nblock_size = 32", "defaults.block_size"),
        ('iteration_overhead_s = "assumption', 'iteration_overhead_s = "it', "sources."),
    ],
)
def test_a_bad_profile_file_names_its_file_and_field(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    text = (Path(load_engine("vllm").source_path)).read_text()
    assert old in text
    path = tmp_path / "mine.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=rf"mine\.toml: {field}"):
        load_engine(str(path))


def test_unset_scheduler_settings_take_the_engines_defaults_and_given_ones_stay() -> None:
    h100 = load_profile("h100-sxm")
    run = resolve_engine(EngineConfig(engine="trtllm"), LLAMA_7B, h100)
    assert (run.config.max_num_seqs, run.config.chunked_prefill) == (2048, False)
    assert run.config.kv_reservation == "full" and run.engine.full_name == "trtllm@1.3"
    given = resolve_engine(EngineConfig(engine="trtllm", chunked_prefill=True), LLAMA_7B, h100)
    assert given.config.chunked_prefill is True
    with pytest.raises(ConfigError, match=r"^engine\.engine: unknown engine 'tgi'"):
        resolve_engine(EngineConfig(engine="tgi"), LLAMA_7B, h100)


@pytest.mark.parametrize("context", [0, 1023, 8191])
def test_batch_1_decode_is_weights_over_bandwidth_plus_the_engines_fixed_terms(
    context: int,
) -> None:
    """Closed form per engine profile, worked out above: GPU time = weights / HBM bandwidth +
    the fixed costs; a not-overlapped engine adds its CPU time, an overlapped one takes the
    longer of the two, and an eager one waits at least kernels x launch cost."""
    hw = _plain_h100()
    gpu = _gpu_decode_step_s(context)
    assert gpu == pytest.approx(
        3.9447e-3 + 0.258e-3 + 0.1619e-3 + (context + 1) * 1.565e-7 + 0.16e-3, rel=1e-4
    )

    def step(engine: EngineProfile) -> float:
        cost = make_cost_model(LLAMA_7B, hw, engine=engine)
        return cost.iteration_time_s([], [context])

    assert step(_engine(overlap_scheduling=False, iteration_overhead_s=2e-3)) == pytest.approx(
        gpu + 2e-3, rel=1e-12
    )
    assert step(_engine(iteration_overhead_s=2e-3)) == pytest.approx(gpu, rel=1e-12)
    assert step(_engine(iteration_overhead_s=9e-3)) == pytest.approx(9e-3, rel=1e-12)
    kernels = GEMMS + ELEMENTWISE + 32  # + one attention kernel per layer; no all-reduce at TP 1
    eager = _engine(cuda_graph_max_tokens=0, eager_launch_s=30e-6, iteration_overhead_s=0.0)
    assert step(eager) == pytest.approx(kernels * 30e-6, rel=1e-12)  # 9.63 ms > the GPU's 4.5
    # the same run of steps, coalesced, prices each step alike
    cost = make_cost_model(LLAMA_7B, hw, engine=_engine(iteration_overhead_s=2e-3))
    ends = cost.decode_run_ends_s(np.array([context]), 3)
    assert np.diff(ends, prepend=0.0) == pytest.approx(
        [_gpu_decode_step_s(context + i) for i in range(3)], rel=1e-12
    )


def test_tensor_parallel_adds_the_engines_all_reduce_below_its_size_limit() -> None:
    """TP 2: two all-reduces per layer of one token's hidden state (4,096 x 2 bytes); the custom
    algorithm's 5 us + 8,192 x 2 (2-1)/2 bytes / 100 GB/s = 5.08192 us beats NCCL's 28 us; a
    2,048-token prefill's 16 MiB message is over custom's 8 MiB limit and goes to NCCL."""
    hw = _plain_h100()
    cost = make_cost_model(LLAMA_7B, hw, tp=2, engine=_engine())
    assert cost.allreduce_iteration_s(1) == pytest.approx(64 * 5.08192e-6, rel=1e-12)
    nccl = 28e-6 + 2048 * 8192 / 350e9
    assert cost.allreduce_iteration_s(2048) == pytest.approx(64 * nccl, rel=1e-12)
    only_nccl = make_cost_model(LLAMA_7B, hw, tp=2, engine=_engine(allreduce=("nccl",)))
    assert only_nccl.allreduce_iteration_s(1) == pytest.approx(64 * (28e-6 + 8192 / 350e9))


def test_the_engines_kernel_table_replaces_the_profiles_terms() -> None:
    """[engines.test] decode_attention = 0.5: decode attention reads KV at half the bandwidth
    with its own 3 us floor, while GEMMs keep the profile's terms."""
    hw = _plain_h100(decode_attention=0.5, decode_attention_floor_s=3e-6)
    cost = make_cost_model(LLAMA_7B, hw, engine=_engine(iteration_overhead_s=0.0))
    context = 1023
    expected = _gpu_decode_step_s(context) - 32 * 5e-6 + 32 * 3e-6
    expected += (context + 1) * KV_BYTES_PER_TOKEN / HBM  # the KV read again: half the rate
    assert cost.iteration_time_s([], [context]) == pytest.approx(expected, rel=1e-12)
    assert cost.kernel_terms == "h100-sxm [engines.test]"
    missing = make_cost_model(LLAMA_7B, _plain_h100(), engine=_engine())
    assert "assumption: no kernel terms measured under test" in missing.kernel_terms


@pytest.mark.parametrize("engine", ["vllm", "vllm@0.6", "sglang", "trtllm"])
@pytest.mark.parametrize("tp", [1, 4])
def test_the_breakdowns_parts_add_up_to_the_iteration(engine: str, tp: int) -> None:
    model = load_model("llama-2-70b") if tp > 1 else LLAMA_7B
    cost = make_cost_model(model, load_profile("h100-sxm"), tp=tp, engine=load_engine(engine))
    for label, prefill, decode in SHAPES:
        b = iteration_breakdown(cost, label, list(prefill), list(decode))
        assert sum(b.parts_s.values()) == pytest.approx(b.total_s, rel=1e-9)
        assert min(b.parts_s.values()) >= -1e-12


def test_a_short_prefill_chunk_runs_attention_below_the_long_chunks_efficiency() -> None:
    """attention_ramp_tokens = 1,850: a 512-token chunk reaches 512 / 2,362 = 21.7 % of the
    long-chunk efficiency's FLOP rate, so its attention FLOPs cost (512 + 1,850) / 512 = 4.61x
    as long; a 16,384-token chunk (16,384 + 1,850) / 16,384 = 1.113x."""
    ramped = make_cost_model(LLAMA_7B, _plain_h100(attention_ramp_tokens=1850.0), engine=_engine())
    flat = make_cost_model(LLAMA_7B, _plain_h100(), engine=_engine())
    for new, factor in ((512, 2362 / 512), (16384, 18234 / 16384)):
        f_ramped, b_ramped = ramped._prefill_pairs_and_reads(new, 0)
        f_flat, b_flat = flat._prefill_pairs_and_reads(new, 0)
        assert f_ramped == pytest.approx(f_flat * factor, rel=1e-12)
        assert b_ramped == b_flat  # bytes are what they are


def test_a_chunk_over_cached_context_pays_the_ramp_only_on_its_causal_part() -> None:
    """The ramp was measured without a cached prefix. A 16-token chunk of Llama-3.1-8B (32
    query heads, 8 KV heads: 4 per KV head) after 100,000 cached tokens: its 136 causal pairs
    pay (16 + 1,850) / 16, its 1,600,000 pairs against the cache fill 16 x 4 = 64 query rows
    of one 64-row FlashAttention-3 tile (no waste); one token fills 4 rows of 64 (16x); 40
    tokens fill 160 rows of two 128-row tiles (1.6x)."""
    llama = load_model("llama-3.1-8b")
    ramped = make_cost_model(llama, _plain_h100(attention_ramp_tokens=1850.0), engine=_engine())
    per_pair = ramped.groups[0].prefill_flops_per_pair
    for new, waste in ((16, 1.0), (1, 16.0), (40, 256 / 160)):
        flops, _ = ramped._prefill_pairs_and_reads(new, 100_000)
        causal = new * (new + 1) / 2 * per_pair * (new + 1850.0) / new
        cached = new * 100_000 * per_pair * waste
        assert flops == pytest.approx(causal + cached, rel=1e-12)


def test_query_tile_waste_follows_flashattention3_tiles() -> None:
    """Rows are query tokens x query heads per KV head: up to 64 in one small tile, else whole
    128-row tiles; a full tile wastes nothing."""
    from kvsim.costmodel.kernels import query_tile_waste

    assert query_tile_waste(1, 1) == 64.0
    assert query_tile_waste(8, 8) == 1.0
    assert query_tile_waste(65, 1) == pytest.approx(128 / 65)
    assert query_tile_waste(256, 1) == 1.0
    assert query_tile_waste(257, 1) == pytest.approx(384 / 257)


def test_decode_attention_pays_a_cost_per_sequence_per_layer() -> None:
    """decode_attention_per_sequence_s = 50 ns: 256 sequences x 32 layers x 50 ns = 409.6 us on
    top of the same step without it, in one iteration and in a coalesced run alike."""
    hw = _plain_h100(decode_attention=1.0, decode_attention_per_sequence_s=50e-9)
    without = _plain_h100(decode_attention=1.0)
    engine = _engine(iteration_overhead_s=0.0)
    with_cost = make_cost_model(LLAMA_7B, hw, engine=engine)
    plain = make_cost_model(LLAMA_7B, without, engine=engine)
    contexts = [1000] * 256
    extra = 256 * 32 * 50e-9
    assert with_cost.iteration_time_s([], contexts) - plain.iteration_time_s(
        [], contexts
    ) == pytest.approx(extra, rel=1e-9)
    run = with_cost.decode_run_ends_s(np.array(contexts), 2) - plain.decode_run_ends_s(
        np.array(contexts), 2
    )
    assert run == pytest.approx([extra, 2 * extra], rel=1e-9)


def test_a_message_of_exactly_the_custom_limit_goes_to_nccl() -> None:
    """vLLM takes a message for its custom all-reduce only while it is smaller than max_size
    (`inp_size < max_size`): 8 MiB itself goes to NCCL."""
    cost = make_cost_model(LLAMA_7B, _plain_h100(), tp=2, engine=_engine())
    tokens = 8 * 2**20 // 8192  # 1,024 tokens of 4,096 bf16 values: exactly 8 MiB
    assert cost.allreduce_iteration_s(tokens) == pytest.approx(
        64 * (28e-6 + 8 * 2**20 / 350e9), rel=1e-12
    )


def test_without_mixed_batches_a_prefill_runs_alone_and_decodes_wait_for_it() -> None:
    """SGLang's default: A decodes; B arrives and its 2,000-token prefill runs as an iteration
    of its own (A's next token waits for it), where vLLM prices one iteration of both."""
    from helpers import Req, make_trace, without_front_end

    from kvsim.engine.simulation import simulate

    hw = without_front_end(load_profile("h100-sxm"))
    reqs = [Req([(1, 100)], 300, arrival_s=0.0), Req([(2, 2000)], 5, arrival_s=0.5)]
    rows = {}
    for mixed in (True, False):
        config = EngineConfig(engine="sglang", mixed_batches=mixed, enable_prefix_caching=False)
        rows[mixed] = simulate(make_trace(reqs), LLAMA_7B, hw, config).requests.to_pydict()
    cost = make_cost_model(LLAMA_7B, hw, engine="sglang")
    alone = cost.iteration_time_s([(2000, 0)], [])
    for mixed, got in rows.items():
        ttft = got["first_token_s"][1] - got["scheduled_s"][1]
        if mixed:
            assert ttft > alone  # A's decode token shares B's iteration
        else:
            assert ttft == pytest.approx(alone, rel=1e-12)
    # A rides B's iteration when they mix; alone, it waits B's prefill out, then decodes
    assert rows[False]["finish_s"][0] > rows[True]["finish_s"][0]

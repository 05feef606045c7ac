"""Measured cost model: interpolation, fallback to the roofline, and validation of the tables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from kvsim.costmodel import MeasuredCostModel, RooflineCostModel, TransferModel, make_cost_model
from kvsim.costmodel.interpolate import RateCurve, RateGrid
from kvsim.costmodel.kernels import allreduce_s
from kvsim.costmodel.shapes import gemm_shapes
from kvsim.errors import ConfigError
from kvsim.hardware import load_profile, validate_profile
from kvsim.models import load_model, parse_model
from kvsim.tomlwrite import dumps

TINY = """
name = "tiny-test"
hf_config = "none/tiny"
hidden_size = 256
num_layers = 2
num_attention_heads = 4
vocab_size = 1024
tie_word_embeddings = true

[[layer_groups]]
kind = "full"
layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 64

[[mlp_groups]]
layers = 2
intermediate_size = 512
"""


def roof(x: np.ndarray) -> np.ndarray:
    return 1e-6 + np.asarray(x, dtype=float) * 1e-9


def test_curve_is_exact_at_measured_points_and_monotone_between() -> None:
    x = np.array([1.0, 4, 16, 64, 256])
    t = np.array([2e-6, 3e-6, 9e-6, 3e-5, 1.1e-4])
    curve = RateCurve(x, t, roof)
    assert np.allclose(curve(x), t, rtol=1e-12)
    grid = np.geomspace(1, 256, 500)
    assert np.all(np.diff(curve(grid)) > 0)


def test_curve_relaxes_to_the_roofline_outside_the_range() -> None:
    x = np.array([10.0, 100, 1000])
    t = 5 * roof(x)  # five times slower than the roofline where measured
    curve = RateCurve(x, t, roof)
    edge = float(curve(1000))
    assert float(curve(1000 * 1.0001)) == pytest.approx(edge, rel=1e-3)  # continuous
    far = np.array([1e4, 1e5, 1e7, 0.1, 1.0])  # a decade or more outside: the roofline
    assert np.allclose(curve(far), roof(far), rtol=1e-12)
    half = float(curve(10**3.5))  # half a decade out: between the two, never exploding
    assert roof(10**3.5) < half < 5 * roof(10**3.5)


def test_grid_is_exact_at_points_and_falls_back_outside() -> None:
    batch, ctx = np.array([1.0, 4, 16]), np.array([64.0, 256, 1024])

    def roof2(b, c):
        return 1e-6 + np.asarray(b) * np.asarray(c) * 1e-10

    secs = 3 * roof2(batch[:, None], ctx[None, :])
    grid = RateGrid(batch, ctx, secs, roof2)
    for i, b in enumerate(batch):
        assert np.allclose(grid(b, ctx), secs[i], rtol=1e-12)
    assert float(grid(1000.0, 64.0)) == pytest.approx(float(roof2(1000, 64)))
    assert float(grid(4.0, 1e6)) == pytest.approx(float(roof2(4, 1e6)))
    row = grid(8.0, np.geomspace(64, 1024, 50))
    assert np.all(np.diff(row) > 0)


def _measured(model, profile, factor: float) -> dict:
    """Tables `factor` times slower than the roofline (synthetic, for exact checks)."""
    tokens = [1, 4, 16, 64, 256]
    gemm = {}
    for name, s in gemm_shapes(model).items():
        secs = [factor * 2.0 * m * s.k * s.n / 1e12 + 1e-6 for m in tokens]
        gemm[name] = {
            "k": s.k,
            "n": s.n,
            "calls": s.calls,
            "per": s.per,
            "tokens": tokens,
            "seconds": secs,
        }
    return {
        "device": "synthetic",
        "device_kind": "cpu",
        "driver": "none",
        "torch": "none",
        "date": "2026-01-01T00:00:00Z",
        "model": model.name,
        "tp": 1,
        "dtype": "bf16",
        "kv_dtype": "bf16",
        "overhead_s": 1e-4,
        "gemm": gemm,
        "elementwise": {"tokens": tokens, "seconds": [factor * 1e-6 * m for m in tokens]},
        "prefill_attention": {
            "tokens": [16, 64, 256],
            "context": [0, 0, 0],
            "seconds": [factor * 1e-5, factor * 1e-4, factor * 1e-3],
        },
        "decode_attention": {
            "batch": [1, 4, 16],
            "context": [64, 256, 1024],
            "seconds": [[factor * 1e-6 * b * c / 64 for c in (64, 256, 1024)] for b in (1, 4, 16)],
        },
        "copy": {"h2d": {"bytes": [4096, 1 << 20, 1 << 24], "seconds": [1e-5, 1e-4, 1e-3]}},
    }


@pytest.fixture()
def tiny():
    return parse_model(TINY, "tiny.toml")


def _profile(model, factor: float = 2.0):
    base = load_profile("h100-sxm")
    return dataclasses.replace(base, measured=_measured(model, base, factor))


def test_measured_tables_change_iteration_times(tiny) -> None:
    slow = make_cost_model(tiny, _profile(tiny, 2.0), engine=None)
    slower = make_cost_model(tiny, _profile(tiny, 4.0), engine=None)
    roofline = make_cost_model(tiny, dataclasses.replace(_profile(tiny), measured={}), engine=None)
    assert (slow.kind, slower.kind, roofline.kind) == ("measured", "measured", "roofline")
    assert isinstance(roofline, RooflineCostModel) and "no measured tables" in roofline.reason
    batch = ([(64, 0)], [256] * 4)
    a, b = slow.iteration_time_s(*batch), slower.iteration_time_s(*batch)
    assert a != pytest.approx(roofline.iteration_time_s(*batch), rel=0.05)
    # twice the measured times: everything but the fixed overhead doubles (plus GEMM's 1 us)
    assert b - 1e-4 == pytest.approx(2 * (a - 1e-4), rel=0.02)
    # at a measured point the attention part is the table's value times the layers
    assert isinstance(slow, MeasuredCostModel)
    assert slow.prefill_attention_s(64, 0) == pytest.approx(2 * 2.0 * 1e-4)
    assert float(slow.decode_attention_s(np.full((1, 4), 256.0))[0]) == pytest.approx(
        2 * 2.0 * 1e-6 * 4 * 256 / 64
    )


def test_decode_runs_match_single_iterations(tiny) -> None:
    cost = make_cost_model(tiny, _profile(tiny), engine=None)
    contexts = np.array([100, 300, 700])
    ends = cost.decode_run_ends_s(contexts, 5)
    steps = [cost.iteration_time_s([], contexts + k) for k in range(5)]
    assert np.allclose(ends, np.cumsum(steps))
    # the engine passes a list of ints (summed in Python): the same bits as the array
    assert cost.decode_run_ends_s(contexts.tolist(), 5).tolist() == ends.tolist()
    assert cost.prefill_time_s(300, chunk=128) == pytest.approx(
        sum(cost.iteration_time_s([(n, c)], []) for n, c in ((128, 0), (128, 128), (44, 256)))
    )


def test_a_batch_priced_from_its_summed_reads_equals_one_priced_per_sequence(tiny) -> None:
    """quant's iterations and runs pass the batch's summed reads (`decode_total`, `total`):
    a model without windows prices them as it prices the contexts themselves."""
    measured = make_cost_model(tiny, _profile(tiny), engine=None)
    roofline = make_cost_model(tiny, dataclasses.replace(_profile(tiny), measured={}), engine=None)
    contexts = [100, 300, 700, 2048]
    reads = [3 * c for c in contexts]  # what the sequences read, e.g. in equivalent tokens
    for cost in (measured, roofline):
        assert not cost.windowed
        alone = cost.iteration_time_s([(64, 32)], reads)
        summed = cost.iteration_time_s([(64, 32)], contexts, float(sum(reads)))
        assert summed == pytest.approx(alone, rel=1e-12)
        assert summed > cost.iteration_time_s([(64, 32)], contexts)
        array = np.array(contexts, dtype=np.float64)
        ends = cost.decode_run_ends_s(3 * array, 6, float(len(contexts)))
        given = cost.decode_run_ends_s(array, 6, float(len(contexts)), float(sum(reads)))
        assert np.allclose(given, ends, rtol=1e-12)
        one_a_step = cost.decode_run_ends_s(array, 6, float(len(contexts)))  # growth: n a step
        assert np.allclose(one_a_step, cost.decode_run_ends_s(array, 6), rtol=1e-12)


def test_beyond_the_tables_each_family_is_the_roofline_models_kernel_terms(tiny) -> None:
    """Over a decade outside the measured range the measured model prices every family with
    the KernelRates terms RooflineCostModel uses (floors, soft ridge, attention and elementwise
    efficiencies), so the two agree where nothing was measured."""
    from kvsim.costmodel.kernels import ELEMENTWISE_KERNELS_PER_LAYER, KernelRates
    from kvsim.costmodel.roofline import model_elementwise_bytes_per_token

    profile = _profile(tiny, 2.0)
    cost = make_cost_model(tiny, profile, engine=None)
    assert isinstance(cost, MeasuredCostModel)
    rates = KernelRates.of(profile, "bf16")
    assert rates == cost.roofline.rates
    m = np.array([1e6, 1e7])  # tables end at 256 tokens (1e5: still the last point's time)
    for (_, _, curve), g in zip(cost.gemm, gemm_shapes(tiny).values(), strict=True):
        want = rates.gemm_s(2.0 * m * g.k * g.n, (g.k * g.n + m * (g.k + g.n)) * 2.0)
        assert np.allclose(curve(m), want, rtol=1e-12)
    per_layer = model_elementwise_bytes_per_token(tiny, 1, 2.0) / tiny.num_layers
    want = rates.elementwise_s(m * per_layer, ELEMENTWISE_KERNELS_PER_LAYER)
    assert np.allclose(cost.elementwise(m), want, rtol=1e-12)
    # and summed over the layers, the roofline model's elementwise term exactly
    roof = cost.roofline
    ew = rates.elementwise_s(m * roof.elementwise_bytes_per_token, roof.elementwise_kernels)
    assert np.allclose(tiny.num_layers * cost.elementwise(m), ew, rtol=1e-12)
    att = cost.att
    batch, context = 1000.0, 1e5  # tables end at 16 x 1024
    keys = batch * (context + 1)
    want = rates.attention_s(
        keys * att.decode_fpp, keys * att.kv_bpt + batch * att.q_bytes_per_token
    )
    assert float(cost.decode(batch, context)) == pytest.approx(float(want), rel=1e-12)
    new = 1e5  # tables end at 256 new tokens
    pairs = new * (new + 1) / 2
    want = rates.attention_s(pairs * att.prefill_fpp, new * (att.kv_bpt + att.q_bytes_per_token))
    assert float(cost.prefill(pairs)) == pytest.approx(float(want), rel=1e-9)


def test_tables_for_another_model_fall_back_to_the_roofline(tiny) -> None:
    other = load_model("qwen2.5-0.5b")
    cost = make_cost_model(other, _profile(tiny), engine=None)
    assert cost.kind == "roofline" and "tiny-test" in cost.reason
    assert make_cost_model(tiny, _profile(tiny), tp=2, engine=None).kind == "roofline"


def test_transfer_model_uses_measured_copies(tiny) -> None:
    transfers = TransferModel(_profile(tiny))
    assert transfers.kind == "measured"
    assert transfers.time_s("dram", 1 << 20) == pytest.approx(1e-4)
    dram = load_profile("h100-sxm").tier("dram")
    # writes were not measured: the tier's latency + bytes / bandwidth
    assert transfers.time_s("dram", 1e9, write=True) == pytest.approx(
        dram.latency_s + 1e9 / dram.write_bandwidth_bytes_per_s
    )


# -- validation of [measured] in a profile file --------------------------------------------------
H100 = (Path(__file__).resolve().parents[1] / "hardware_profiles" / "h100-sxm.toml").read_text()


def _write(tmp_path: Path, measured: dict) -> Path:
    path = tmp_path / "measured" / "bad.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(H100 + "\n" + dumps({"measured": measured}))
    return path


def test_a_good_measured_profile_loads(tmp_path: Path, tiny) -> None:
    doc = _measured(tiny, None, 2.0) | {"rounds": 5, "scrub_bytes": 1 << 20}  # provenance
    path = _write(tmp_path, doc)
    profile = validate_profile(path)
    assert make_cost_model(tiny, profile, engine=None).kind == "measured"


def _drop(doc: dict, *keys: str) -> dict:
    doc = dict(doc)
    *head, last = keys
    target = doc
    for k in head:
        target[k] = dict(target[k])
        target = target[k]
    del target[last]
    return doc


def _set(doc: dict, keys: tuple[str, ...], value) -> dict:
    doc = dict(doc)
    *head, last = keys
    target = doc
    for k in head:
        target[k] = dict(target[k])
        target = target[k]
    target[last] = value
    return doc


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: _drop(d, "decode_attention"), "measured.decode_attention: missing required"),
        (lambda d: _drop(d, "model"), "measured.model: expected a non-empty string"),
        (
            lambda d: _set(d, ("gemm", "qkv", "tokens"), [1, 4, 4, 64, 256]),
            "measured.gemm.qkv.tokens: expected strictly increasing",
        ),
        (
            lambda d: _set(d, ("gemm", "o", "seconds"), [1e-6, 2e-6]),
            "measured.gemm.o.seconds: expected 5 values",
        ),
        (
            lambda d: _set(d, ("elementwise", "seconds"), [1e-6, -1.0, 1e-6, 1e-6, 1e-6]),
            "measured.elementwise.seconds: expected a non-empty list of positive numbers",
        ),
        (
            lambda d: _set(d, ("decode_attention", "seconds"), [[1e-6, 2e-6, 3e-6]]),
            "measured.decode_attention.seconds: expected 3 rows",
        ),
        (lambda d: _set(d, ("tp",), 0), "measured.tp: expected a positive integer"),
        (lambda d: _set(d, ("speed",), 3), "measured.speed: unknown field"),
        (
            lambda d: _set(d, ("copy", "sideways"), {"bytes": [1], "seconds": [1.0]}),
            "measured.copy.sideways: unknown copy direction",
        ),
    ],
    ids=[
        "partial",
        "no-model",
        "not-increasing",
        "short",
        "negative",
        "rows",
        "tp",
        "unknown",
        "copy",
    ],
)
def test_corrupt_measured_tables_name_file_and_field(tmp_path: Path, tiny, edit, expected) -> None:
    path = _write(tmp_path, edit(_measured(tiny, None, 2.0)))
    with pytest.raises(ConfigError) as info:
        validate_profile(path)
    message = str(info.value)
    assert "bad.toml: " in message and expected in message and "\n" not in message


def test_extrapolation_never_undercuts_the_measured_edge() -> None:
    """Measurements far above the roofline (a CPU's) must not bend down past the last point."""
    x = np.array([64.0, 256, 1024])
    t = 1e4 * roof(x)  # 10^4 x slower than the roofline
    curve = RateCurve(x, t, roof)
    beyond = curve(np.geomspace(1024, 1e6, 50))
    assert np.all(np.diff(beyond) >= -1e-12 * beyond[1:]) and beyond[0] == pytest.approx(t[-1])
    assert np.all(curve(np.geomspace(1, 64, 50)) <= t[0] * (1 + 1e-12))

    def roof2(b, c):
        return 1e-9 * np.asarray(b) * np.asarray(c)

    batch, ctx = np.array([1.0, 4, 16]), np.array([64.0, 256, 1024])
    grid = RateGrid(batch, ctx, 1e4 * roof2(batch[:, None], ctx[None, :]), roof2)
    row = grid(1.0, np.geomspace(1024, 1e6, 50))
    assert np.all(np.diff(row) >= -1e-12 * row[1:])
    assert row[0] == pytest.approx(1e4 * roof2(1, 1024))


# -- all-reduce table --------------------------------------------------------------------------
def _tp2(model, allreduce: dict | None) -> dict:
    """Tables of ``model`` at tp=2 (shapes per rank), with an optional all-reduce curve."""
    doc = _measured(model, None, 2.0) | {"tp": 2}
    tokens = doc["elementwise"]["tokens"]
    doc["gemm"] = {
        name: {"k": s.k, "n": s.n, "calls": s.calls, "per": s.per, "tokens": tokens}
        | {"seconds": [2.0 * m * s.k * s.n / 1e12 + 1e-6 for m in tokens]}
        for name, s in gemm_shapes(model, 2).items()
    }
    if allreduce is not None:
        doc["allreduce"] = allreduce
    return doc


AR = {"bytes": [512, 8192, 131072, 2097152], "seconds": [2e-5, 2.2e-5, 3e-5, 1.2e-4]}


def test_allreduce_table_prices_the_tp_all_reduces(tiny) -> None:
    base = load_profile("h100-sxm")
    with_table = make_cost_model(
        tiny, dataclasses.replace(base, measured=_tp2(tiny, AR)), tp=2, engine=None
    )
    without = make_cost_model(
        tiny, dataclasses.replace(base, measured=_tp2(tiny, None)), tp=2, engine=None
    )
    assert isinstance(with_table, MeasuredCostModel) and isinstance(without, MeasuredCostModel)
    calls = 2 * tiny.num_layers
    bytes_per_token = tiny.hidden_size * 2
    # at a measured size: exactly the table's seconds per call (8192 bytes = 16 tokens)
    tokens = 8192 / bytes_per_token
    assert float(with_table.allreduce_time_s(tokens)) == pytest.approx(calls * 2.2e-5, rel=1e-12)
    # no table: latency + bytes / bus bandwidth of the profile's algorithms (kernels.py)
    expected = calls * allreduce_s(base.allreduce_algorithms, tokens * bytes_per_token, 2)
    assert float(without.allreduce_time_s(tokens)) == pytest.approx(expected, rel=1e-12)
    # the difference reaches the iteration time, token for token
    batch = ([], [100] * 16)
    gap = with_table.iteration_time_s(*batch) - without.iteration_time_s(*batch)
    assert gap == pytest.approx(calls * 2.2e-5 - expected, rel=1e-9)
    # a decade beyond the largest measured message: the roofline again
    far = 2097152 * 10.0 / bytes_per_token
    roof = calls * allreduce_s(base.allreduce_algorithms, far * bytes_per_token, 2)
    assert float(with_table.allreduce_time_s(far)) == pytest.approx(max(roof, calls * 1.2e-4))
    # coalesced decode runs price the same all-reduces as single iterations
    ends = with_table.decode_run_ends_s(np.array([100.0] * 16), 3)
    steps = [with_table.iteration_time_s([], [100 + k] * 16) for k in range(3)]
    assert np.allclose(ends, np.cumsum(steps))


def test_tp1_tables_have_no_all_reduce(tiny) -> None:
    cost = make_cost_model(tiny, _profile(tiny), engine=None)
    assert float(cost.allreduce_time_s(1000)) == 0.0


def test_fp16_tables_price_bf16_kv(tiny) -> None:
    doc = _measured(tiny, None, 2.0) | {"dtype": "fp16", "kv_dtype": "fp16"}
    profile = dataclasses.replace(load_profile("h100-sxm"), measured=doc)
    assert (
        make_cost_model(tiny, profile, weight_dtype="fp16", kv_dtype="bf16", engine=None).kind
        == "measured"
    )
    fp8 = make_cost_model(tiny, profile, weight_dtype="fp16", kv_dtype="fp8", engine=None)
    assert fp8.kind == "roofline" and "kv dtype fp16, not fp8" in fp8.reason


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (lambda m: _measured(m, None, 2.0) | {"allreduce": AR}, "needs measured.tp > 1"),
        (
            lambda m: _tp2(m, {"bytes": [512, 512], "seconds": [1e-5, 2e-5]}),
            "measured.allreduce.bytes: expected strictly increasing",
        ),
        (
            lambda m: _tp2(m, {"bytes": [512, 1024], "seconds": [1e-5]}),
            "measured.allreduce.seconds: expected 2 values",
        ),
        (
            lambda m: _tp2(m, None) | {"filled_from_roofline": "gemm.lm_head"},
            "measured.filled_from_roofline: expected a list of non-empty strings",
        ),
        (lambda m: _tp2(m, None) | {"licence": ""}, "measured.licence: expected a non-empty"),
    ],
    ids=["tp1", "not-increasing", "short", "filled-not-list", "empty-licence"],
)
def test_bad_allreduce_and_provenance_fields(tmp_path: Path, tiny, doc, expected) -> None:
    path = _write(tmp_path, doc(tiny))
    with pytest.raises(ConfigError) as info:
        validate_profile(path)
    assert "bad.toml: " in str(info.value) and expected in str(info.value)


def test_allreduce_and_provenance_load_from_a_file(tmp_path: Path, tiny) -> None:
    doc = _tp2(tiny, AR) | {"source": "https://example.org", "filled_from_roofline": ["x"]}
    profile = validate_profile(_write(tmp_path, doc))
    cost = make_cost_model(tiny, profile, tp=2, engine=None)
    assert isinstance(cost, MeasuredCostModel) and cost.allreduce is not None
    assert cost.tables.extra["filled_from_roofline"] == ["x"]


def test_measured_tables_under_an_overlapping_engine_schedule_ahead_as_the_roofline_does(
    tiny,
) -> None:
    """Whether arrivals wait for the batch after next comes from the cost model's clock, so a
    measured profile under vLLM V1 schedules ahead as the roofline model does."""
    from kvsim.engines import load_engine

    for engine, ahead in (("vllm@0.24", True), ("vllm@0.6", False)):
        measured = make_cost_model(tiny, _profile(tiny), engine=load_engine(engine))
        roofline = make_cost_model(
            tiny, dataclasses.replace(_profile(tiny), measured={}), engine=load_engine(engine)
        )
        assert measured.kind == "measured"
        assert measured.clock.overlap is roofline.clock.overlap is ahead

"""The kernel terms of the cost model (issue 11), their fit, and the check against Vidur's data."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import Req, make_trace

from kvsim.calibrate.kernel_fit import (
    AllReducePoints,
    KernelFit,
    KernelPoints,
    fit_allreduce,
    fit_kernels,
    predict_allreduce,
)
from kvsim.costmodel.kernels import allreduce_s, blend, summed
from kvsim.costmodel.roofline import RooflineCostModel, compute_dtype_for
from kvsim.engine import EngineConfig, simulate
from kvsim.hardware import load_profile
from kvsim.hardware.profile import AllReduceAlgorithm
from kvsim.models import load_model

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_blend_is_the_roofline_at_infinity_and_a_norm_otherwise() -> None:
    assert blend(3.0, 2.0, math.inf) == 3.0
    # p = 2 at the ridge: sqrt(2) times either limit
    assert float(blend(1.0, 1.0, 2.0)) == pytest.approx(math.sqrt(2))
    # far from the ridge the larger term dominates
    assert float(blend(1.0, 1e-6, 1.3)) == pytest.approx(1.0, rel=1e-6)


def test_a_summed_context_has_numpy_pairwise_bits() -> None:
    """Ints are added exactly in Python; floats go to numpy, whose pairwise sum differs from
    Python's left-to-right one (0.1 a thousand times: 99.9999999999986 against 100.0...)."""
    rng = np.random.default_rng(5)
    for size in (1, 7, 130, 4000):
        ints = rng.integers(0, 1 << 21, size).tolist()
        assert summed(ints) == float(np.asarray(ints, dtype=np.float64).sum())
        assert summed(np.asarray(ints)) == summed(ints)
    tenths = [0.1] * 1000
    assert sum(tenths) != float(np.sum(tenths))  # the two orders differ here
    assert summed(tenths) == float(np.sum(tenths))


def test_a_decode_run_priced_from_a_list_has_the_array_bits() -> None:
    """The scheduler prices a run from its requests' contexts as a list (no numpy round trip):
    the same bits as from an array, with and without sliding windows."""
    profile = load_profile("h100-sxm")
    contexts = [1200, 800, 30000, 450, 2222, 1500, 9]
    for name in ("llama-3.1-8b", "gemma-2-27b"):
        cost = RooflineCostModel(load_model(name), profile)
        from_array = cost.decode_run_ends_s(np.asarray(contexts, dtype=np.float64), 40)
        assert cost.decode_run_ends_s(contexts, 40).tolist() == from_array.tolist()


def test_allreduce_takes_the_cheapest_algorithm() -> None:
    ring = AllReduceAlgorithm("ring", 20e-6, 1e-6, 300e9)
    nvls = AllReduceAlgorithm("nvls", 60e-6, 0.0, 600e9, min_gpus=4)
    # 8 GPUs, 1 MB: ring 20 + 7 + 1e6 * 2 * 7/8 / 300e9 s = 27 + 5.83 us
    assert allreduce_s((ring,), 1e6, 8) == pytest.approx(27e-6 + 1.75e6 / 300e9)
    # small message: the ring's lower latency wins; large: NVLS's bandwidth
    assert allreduce_s((ring, nvls), 1e3, 8) == pytest.approx(allreduce_s((ring,), 1e3, 8))
    assert allreduce_s((ring, nvls), 1e9, 8) == pytest.approx(allreduce_s((nvls,), 1e9, 8))
    # NVLS needs 4 GPUs: at 2 only the ring applies
    assert allreduce_s((ring, nvls), 1e9, 2) == pytest.approx(allreduce_s((ring,), 1e9, 2))
    assert allreduce_s((ring,), 1e9, 1) == 0.0


def test_fits_recover_known_parameters() -> None:
    rng = np.random.default_rng(0)
    truth = KernelFit(compute=0.7, memory=0.85, ridge=1.6, floor_s=4e-6)
    m = rng.integers(1, 8192, 400).astype(np.float64)
    k, n = 4096.0, 11008.0
    p = KernelPoints(2 * m * k * n, (k * n + m * (k + n)) * 2, np.ones_like(m), np.ones_like(m))
    p = dataclasses.replace(p, seconds=truth.predict(p, 1e15, 3e12))
    got = fit_kernels(p, 1e15, 3e12)
    assert got.compute == pytest.approx(0.7, rel=0.02)
    assert got.memory == pytest.approx(0.85, rel=0.02)
    assert got.ridge == pytest.approx(1.6, rel=0.05)
    assert got.floor_s == pytest.approx(4e-6, rel=0.05)
    ring = AllReduceAlgorithm("ring", 25e-6, 0.5e-6, 350e9)
    gpus = np.repeat([2.0, 4.0, 8.0], 50)
    nbytes = np.tile(np.geomspace(1e3, 1e8, 50), 3)
    pts = AllReducePoints(gpus, nbytes, np.ones_like(gpus))
    pts = dataclasses.replace(pts, seconds=predict_allreduce(ring, pts))
    fitted = fit_allreduce(pts)
    assert fitted.latency_s == pytest.approx(25e-6, rel=0.02)
    assert fitted.bus_bandwidth_bytes_per_s == pytest.approx(350e9, rel=0.02)


def test_fp8_weights_compute_at_the_fp8_peak_where_the_gpu_has_one() -> None:
    h100, a100 = load_profile("h100-sxm"), load_profile("a100-80gb")
    assert compute_dtype_for("fp8", h100) == "fp8"
    assert compute_dtype_for("fp8", a100) == "bf16"  # no FP8 tensor cores: W8A16
    assert compute_dtype_for("int4", h100) == "bf16"
    model = load_model("llama-3.1-8b")
    bf16 = RooflineCostModel(model, h100, weight_dtype="bf16")
    fp8 = RooflineCostModel(model, h100, weight_dtype="fp8")
    # a long prefill is compute-bound: its GEMMs take about half as long at twice the peak
    gemm_bf16 = bf16.rates.gemm_s(bf16.linear_flops_per_token * 8192, 0.0)
    gemm_fp8 = fp8.rates.gemm_s(fp8.linear_flops_per_token * 8192, 0.0)
    assert gemm_fp8 == pytest.approx(gemm_bf16 / 2, rel=0.01)
    assert fp8.iteration_time_s([(8192, 0)], []) < 0.7 * bf16.iteration_time_s([(8192, 0)], [])


def test_rates_take_the_dtype_peak_else_bf16_else_the_largest() -> None:
    """A CPU calibrated in fp32 writes a profile whose only peak is fp32's: no KeyError."""
    from kvsim.costmodel.kernels import KernelRates

    base = load_profile("h100-sxm")
    peaks = base.gpu.peak_flops_per_s
    compute = base.efficiency.compute

    def with_peaks(p: dict[str, float]):
        return dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, peak_flops_per_s=p))

    assert KernelRates.of(base, "fp8").gemm_flops_per_s == pytest.approx(peaks["fp8"] * compute)
    no_fp8 = with_peaks({"bf16": 1e15, "fp32": 5e13})
    assert KernelRates.of(no_fp8, "fp8").gemm_flops_per_s == pytest.approx(1e15 * compute)
    cpu = with_peaks({"fp32": 2e11, "int8": 6e11})
    assert KernelRates.of(cpu, "fp32").gemm_flops_per_s == pytest.approx(2e11 * compute)
    assert KernelRates.of(cpu).gemm_flops_per_s == pytest.approx(6e11 * compute)
    cost = RooflineCostModel(load_model("llama-3.1-8b"), with_peaks({"fp32": 2e11}))
    assert cost.rates.gemm_flops_per_s == pytest.approx(2e11 * compute)


def test_lm_head_runs_once_per_sequence() -> None:
    model = load_model("llama-3.1-8b")
    cost = RooflineCostModel(model, load_profile("h100-sxm"))
    one_seq = cost.linear_s(4096, 1)
    per_token = cost.linear_s(4096, 4096)
    assert one_seq < per_token
    extra_flops = 4095 * 2 * model.hidden_size * model.vocab_size
    assert float(per_token - one_seq) == pytest.approx(
        extra_flops / cost.rates.gemm_flops_per_s, rel=0.05
    )


def test_tensor_parallel_decode_pays_allreduce_latency() -> None:
    model = load_model("llama-3.1-70b")
    profile = load_profile("h100-sxm")
    tp4 = RooflineCostModel(model, profile, tp=4)
    # 160 all-reduces of one token's hidden state: each about the latency, 28 + 3 x 0.48 us
    per_call = profile.allreduce_algorithms[0].latency_s + 3 * 0.48e-6
    assert float(tp4.allreduce_iteration_s(1)) == pytest.approx(160 * per_call, rel=0.01)
    assert 3e-3 < float(tp4.allreduce_iteration_s(1)) < 6e-3  # issue 11: 3-6 ms per iteration


def test_request_overhead_delays_a_lone_request_by_exactly_itself() -> None:
    model = load_model("llama-3.1-8b")
    shipped = load_profile("h100-sxm")
    base, slow = (
        dataclasses.replace(
            shipped, efficiency=dataclasses.replace(shipped.efficiency, request_overhead_s=s)
        )
        for s in (0.0, 0.025)
    )
    trace = make_trace([Req([(1, 300)], 20, arrival_s=0.0)])
    a = simulate(trace, model, base, EngineConfig()).requests.to_pydict()
    b = simulate(trace, model, slow, EngineConfig()).requests.to_pydict()
    assert b["ttft_s"][0] - a["ttft_s"][0] == pytest.approx(0.025)
    assert b["e2e_s"][0] - a["e2e_s"][0] == pytest.approx(0.025)


def test_kernel_terms_predict_held_out_vidur_measurements() -> None:
    """Independent check: the shipped subset of Vidur's profiles (benchmarks/data/vidur)."""
    sys.path.insert(0, str(BENCH))
    try:
        import validate_kernels as vk
    finally:
        sys.path.remove(str(BENCH))
    for gpu in ("a100", "h100"):
        result = vk.validate_gpu(vk.SHIPPED, gpu)
        held = {r["family"]: r["fitted"] for r in result["rows"] if r["half"] == "held-out"}
        assert held["GEMM"]["median_abs"] < 0.10, gpu
        assert held["all-reduce"]["median_abs"] < 0.10, gpu
        assert held["elementwise"]["median_abs"] < 0.15, gpu
    summary = vk.iteration_summary(vk.iteration_rows(vk.SHIPPED, "a100"))
    for row in summary:
        if row["model"] == "llama-2-70b" and row["kind"] != "linear part":
            assert row["median_abs"] < 0.10 and row["worst_abs"] < 0.25, row

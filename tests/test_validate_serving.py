"""benchmarks/validate_serving.py: its data file, its error arithmetic and its fit/held-out split.

No long runs here: the replay itself is exercised on one tiny point.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "validate_serving.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_serving", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["validate_serving"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


vs = _load()


def _point(**over: object) -> object:
    base: dict[str, object] = {
        "id": "p",
        "source": "s",
        "engine": "vllm@0.24",
        "gpu": "h100-sxm",
        "model": "llama-3.1-8b",
        "tp": 1,
        "weight_dtype": "bf16",
        "kv_dtype": "bf16",
        "workload": "fixed",
        "arrival": "poisson",
        "below_saturation": True,
        "quote": "q",
        "measured": {"ttft_s": 0.1},
        "input_tokens": 64,
        "output_tokens": 8,
        "rate_per_s": 2.0,
    }
    base.update(over)
    return vs.Point(**base)


def test_data_file_parses_and_every_point_is_sourced() -> None:
    data = vs.load_dataset()
    assert len(data.points) >= 20
    raw = tomllib.loads(vs.DATA.read_text(encoding="utf-8"))
    for point, table in zip(data.points, raw["points"], strict=True):
        source = data.sources[point.source]
        assert source["url"].startswith("https://")
        assert source["measured"] and table["quote"]
        assert point.measured, point.id
        assert point.tp >= 1 and point.gpu and point.engine and point.published_engine
    # both halves, both saturation classes, every source in each half
    halves = vs.split_halves(data.points)
    for source in data.sources:
        got = {halves[p.id] for p in data.points if p.source == source}
        assert got == {"fit", "held-out"}, source
    assert any(p.below_saturation for p in data.points)
    assert any(not p.below_saturation for p in data.points)


def test_models_and_profiles_named_by_the_data_exist() -> None:
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    data = vs.load_dataset()
    for name in {p.model for p in data.points}:
        load_model(name)
    for name in {p.gpu for p in data.points}:
        load_profile(name)


def test_missing_field_is_refused(tmp_path: Path) -> None:
    text = vs.DATA.read_text(encoding="utf-8")
    first = text.index('quote = "| 4 | 1200 | SGLang')
    broken = tmp_path / "serving.toml"
    broken.write_text(text[:first] + text[text.index("\n", first) + 1 :], encoding="utf-8")
    with pytest.raises(ValueError, match="missing quote"):
        vs.load_dataset(broken)


def test_split_alternates_within_each_source_by_sorted_id() -> None:
    points = [
        _point(id=i, source=s) for s, i in [("a", "a3"), ("a", "a1"), ("b", "b1"), ("a", "a2")]
    ]
    assert vs.split_halves(points) == {"a1": "fit", "a2": "held-out", "a3": "fit", "b1": "fit"}


def test_error_fit_and_summary_on_a_hand_worked_case() -> None:
    assert vs.signed_error(90.0, 100.0) == pytest.approx(-0.10)
    assert vs.signed_error(125.0, 100.0) == pytest.approx(0.25)
    # kvsim TTFT 20 ms with 5 ms of applied overhead inside: 15 ms without it.
    rows = []
    for pid, engine, half, measured, below in [
        ("a", "x@1", "fit", 0.030, True),  # gap 15 ms
        ("b", "x@1", "fit", 0.045, True),  # gap 30 ms
        ("c", "x@1", "fit", 0.020, True),  # gap  5 ms
        ("d", "x@1", "fit", 9.000, False),  # saturated: not in the fit
        ("e", "x@1", "held-out", 0.035, True),  # held out: not in the fit
        ("f", "y@2", "fit", 0.065, True),  # the other engine: gap 50 ms, fitted on its own
        ("g", "z@3", "held-out", 0.040, True),  # an engine with no fit point keeps its 5 ms
    ]:
        p = _point(
            id=pid,
            engine=engine,
            measured={"ttft_s": measured, "e2e_s": 1.0},
            below_saturation=below,
        )
        r = vs.Result(p, {"ttft_s": 0.020, "e2e_s": 0.9}, {"ttft_s": 0.015, "e2e_s": 0.895}, 1, 0.0)
        r.half = half
        rows.append(r)
    fits = vs.fit_overheads(rows)
    assert fits == {
        "x@1": (pytest.approx(0.015), 3, pytest.approx(0.015), 1),
        "y@2": (pytest.approx(0.050), 1, pytest.approx(0.050), 1),
    }
    vs.apply_fit(rows, {engine: value for engine, (value, *_) in fits.items()})
    # a negative gap (kvsim too slow without any front end) fits an overhead of 0
    slow = _point(id="h", engine="w@4", measured={"ttft_s": 0.010})
    fast = vs.Result(slow, {"ttft_s": 0.020}, {"ttft_s": 0.015}, 1, 0.0)
    fast.half = "fit"
    assert vs.fit_overheads([fast]) == {"w@4": (0.0, 1, pytest.approx(-0.005), 1)}
    held, other, unfitted = rows[4], rows[5], rows[6]
    # each source votes once: two of one source (15, 30 ms: votes 22.5), extra gaps of another
    # (5 ms) and a third (40 ms) give the median vote, 22.5 ms, however many points each has
    votes = vs.fit_overheads(rows[:2], {"x@1": {"t": [0.005] * 9, "u": [0.040]}})
    assert votes == {"x@1": (pytest.approx(0.0225), 12, pytest.approx(0.0225), 3)}
    assert held.fitted["ttft_s"] == pytest.approx(0.030)
    assert held.fitted["e2e_s"] == pytest.approx(0.910)
    assert other.fitted["ttft_s"] == pytest.approx(0.065)
    assert unfitted.fitted["ttft_s"] == pytest.approx(0.020)
    assert vs.errors(held, "now")["ttft_s"] == pytest.approx((0.020 - 0.035) / 0.035)
    assert vs.errors(held, "fitted")["ttft_s"] == pytest.approx((0.030 - 0.035) / 0.035)
    summary = {(s["half"], s["load"], s["metric"]): s for s in vs.summarize(rows[:5], "fitted")}
    fit_ttft = summary[("fit", "below saturation", "TTFT")]
    assert fit_ttft["n"] == 3
    # errors 0, -1/3, +0.5 -> median |error| 1/3, worst 0.5 at c
    assert fit_ttft["median"] == pytest.approx(1 / 3)
    assert (fit_ttft["worst"], fit_ttft["worst_id"]) == (pytest.approx(0.5), "c")
    assert summary[("held-out", "below saturation", "TTFT")]["n"] == 1
    assert summary[("fit", "saturated", "TTFT")]["n"] == 1


def test_knee_interpolates_between_the_bracketing_loads() -> None:
    # lightest TTFT 0.4 -> limit 1.2, crossed between 50 (0.8) and 100 (8.0): 50 + 50 * 0.4 / 7.2
    knee, bracket = vs.knee([1, 25, 50, 100, 150], [0.4, 0.6, 0.8, 8.0, 30.0])
    assert knee == pytest.approx(50 + 50 * 0.4 / 7.2)
    assert bracket == (50, 100)
    # unsorted input, and a sweep that never saturates
    assert vs.knee([3.0, 1.0, 2.0], [0.06, 0.05, 0.055]) == (None, None)
    points = [
        _point(id=f"r{i}", rate_per_s=rate, measured={"ttft_s": ttft})
        for i, (rate, ttft) in enumerate([(1.0, 0.1), (2.0, 0.2), (4.0, 0.5), (8.0, 5.0)])
    ]
    points.append(_point(id="two-loads", source="t", measured={"ttft_s": 0.1}))
    (sweep,) = vs.find_sweeps(points)  # the other source has one load: no sweep
    # limit 3 x 0.1 = 0.3, crossed between 2 (0.2) and 4 (0.5): 2 + 2 * 0.1 / 0.3
    assert sweep.published_bracket == (2.0, 4.0)
    assert sweep.published_knee == pytest.approx(2.0 + 2.0 * 0.1 / 0.3)
    sweep.kvsim_knee = sweep.published_knee * 1.1
    assert sweep.verdict() == ("+10%", True)
    sweep.kvsim_knee = sweep.published_knee * 0.8
    assert sweep.verdict()[1] is False
    assert vs.grid_loads(sweep) and all(1.0 < x <= 8.0 for x in vs.grid_loads(sweep))


def test_every_point_names_a_real_engine_profile_and_is_quoted() -> None:
    from kvsim.engines import load_engine

    data = vs.load_dataset()
    raw = tomllib.loads(vs.DATA.read_text(encoding="utf-8"))
    for table in raw["points"]:
        assert str(table.get("quote", "")).strip(), table["id"]
    for name in {p.engine for p in data.points}:
        assert load_engine(name).full_name == name  # name@version, as the profile spells it
    for key, source in data.sources.items():
        assert source["url"].startswith("https://"), key
    # the old engines keep their points, each under its own profile
    engines = {p.engine for p in data.points}
    assert {"sglang@0.3", "vllm@0.6", "nim@1.8", "trtllm@1.0"} <= engines
    assert {"vllm@0.24", "sglang@0.5"} <= engines
    assert {p.engine for p in data.points if p.published_engine.startswith("vLLM v0.6")} == {
        "vllm@0.6"
    }


def test_engine_filter_and_stated_settings() -> None:
    assert vs.engine_matches("vllm@0.24", ["vllm"])
    assert vs.engine_matches("vllm@0.6", ["sglang", "vllm@0.6"])
    assert not vs.engine_matches("vllm@0.24", ["vllm@0.2"])
    assert not vs.engine_matches("sglang@0.5", ["vllm"])
    point = _point(num_scheduler_steps=10)
    source = {"url": "https://x", "max_num_batched_tokens": 4096, "notes": "n"}
    assert vs.stated_settings(point, source) == {
        "max_num_batched_tokens": 4096,
        "num_scheduler_steps": 10,
    }
    config = vs.engine_config(point, source)
    assert config.max_num_batched_tokens == 4096 and config.num_scheduler_steps == 10
    assert config.tp == 1 and not config.enable_prefix_caching


def test_workloads_have_the_published_shape() -> None:
    data = vs.load_dataset()
    assert data.sharegpt is not None
    ins, outs = vs.sharegpt_lengths(data.sharegpt, 4000, np.random.default_rng(1))
    assert len(ins) == len(outs) == 4000
    assert ins.min() >= 4 and outs.min() >= 4 and ins.max() <= 1024
    assert (ins + outs).max() <= 2048
    assert 150 < ins.mean() < 260 and 150 < outs.mean() < 230
    closed = vs.build_trace(_point(arrival="concurrency", concurrency=3), 7, None)
    table = closed.table
    assert table.column("session_id").to_pylist() == [0, 1, 2, 0, 1, 2, 0]
    think = table.column("think_time_s").to_pylist()
    assert think[:3] == [None, None, None] and think[3:] == [0.0] * 4
    offline = vs.build_trace(_point(arrival="offline"), 5, None)
    assert offline.table.column("arrival_s").to_pylist() == [0.0] * 5
    uniform = _point(workload="uniform", input_min_tokens=100, input_max_tokens=200, num_prompts=9)
    lengths = vs.build_trace(uniform, 400, None).table.column("input_tokens").to_numpy()
    assert lengths.min() >= 100 and lengths.max() <= 200 and 130 < lengths.mean() < 170
    ranged = vs.build_trace(
        _point(
            workload="uniform",
            input_min_tokens=1,
            input_max_tokens=8,
            output_min_tokens=1,
            output_max_tokens=1024,
        ),
        400,
        None,
    )
    outs = ranged.table.column("output_tokens").to_numpy()
    assert outs.min() >= 1 and outs.max() <= 1024 and 400 < outs.mean() < 620
    # a source's published ShareGPT means replace the file's
    source_means = {"url": "https://x", "sharegpt_input_mean_tokens": 207.0}
    data = vs.Dataset([], {"s": source_means}, data.sharegpt)
    spec = vs.sharegpt_for(data, _point(workload="sharegpt"))
    assert spec is not None and spec.input_mean_tokens == 207.0
    assert spec.output_mean_tokens == data.sharegpt.output_mean_tokens


def test_a_tiny_point_replays_through_kvsim() -> None:
    data = vs.Dataset([], {"s": {"url": "https://example"}}, None)
    point = _point(measured={"ttft_s": 0.05, "tpot_s": 0.01, "e2e_s": 0.2}, num_prompts=6)
    result = vs.run_point(data, point, max_requests=6)
    assert result.requests == 6
    assert 0 < result.kvsim["ttft_s"] < result.kvsim["e2e_s"]
    assert result.kvsim["itl_s"] == result.kvsim["tpot_s"] > 0
    assert result.raw["tpot_s"] == result.kvsim["tpot_s"]

"""Engine scheduler modes of real engines (issue 11): vLLM v0 multi-step rounds, TensorRT-LLM's
GUARANTEED_NO_EVICT reservation and its unchunked context phase."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import Req, make_trace, without_front_end

from kvsim.costmodel import make_cost_model
from kvsim.engine import EngineConfig, simulate
from kvsim.engine.resolve import check_fields
from kvsim.engines.registry import PROFILES_DIR
from kvsim.errors import ConfigError
from kvsim.hardware import load_profile
from kvsim.models import load_model

MODEL = load_model("llama-3.1-8b")
# the front end's per-request overhead shifts every request alike; without it the times below
# are the cost model's iterations exactly
PROFILE = without_front_end(load_profile("h100-sxm"))


def run(reqs, **engine):
    config = EngineConfig(enable_prefix_caching=False, **engine)
    return simulate(make_trace(reqs), MODEL, PROFILE, config).requests.to_pydict()


def test_multi_step_admits_only_at_the_end_of_a_round() -> None:
    # A decodes alone; B arrives 3 decode steps into A's first round of 10
    cost = make_cost_model(MODEL, PROFILE)
    prefill_s = cost.iteration_time_s([(100, 0)], [])
    steps = cost.decode_run_ends_s(np.array([100.0]), 10)
    b_arrives = prefill_s + float(steps[2]) + 1e-4
    reqs = [Req([(1, 100)], 200, arrival_s=0.0), Req([(2, 50)], 5, arrival_s=b_arrives)]
    single = run(reqs)
    multi = run(reqs, num_scheduler_steps=10)
    # one step at a time: A's next step was scheduled when the one B arrived in began (vLLM
    # V1's async scheduling), so B starts with the step after it
    assert single["scheduled_s"][1] == pytest.approx(prefill_s + float(steps[4]))
    # ten at a time: B waits for the round's tenth step
    assert multi["scheduled_s"][1] == pytest.approx(prefill_s + float(steps[9]))
    assert multi["ttft_s"][1] > single["ttft_s"][1]
    # A alone is decoded the same way either way
    assert multi["ttft_s"][0] == pytest.approx(single["ttft_s"][0])


def test_full_reservation_never_preempts_where_prompt_reservation_does() -> None:
    reqs = [Req([(i + 1, 1000)], 1500, arrival_s=0.0) for i in range(40)]
    prompt = run(reqs, num_gpu_blocks=1500)
    full = run(reqs, num_gpu_blocks=1500, kv_reservation="full")
    assert sum(prompt["preemptions"]) > 0
    assert sum(full["preemptions"]) == 0
    assert all(f > 0 for f in full["finish_s"])
    # 1500 blocks of 16 tokens hold 9 requests of 2500 tokens: at most 9 start before one ends
    first_finish = min(full["finish_s"])
    started = sum(1 for s in full["scheduled_s"] if s < first_finish)
    assert started <= 1500 * 16 // 2500


def test_unchunked_prefill_waits_for_room_for_the_whole_prompt() -> None:
    reqs = [Req([(1, 5000)], 10, arrival_s=0.0), Req([(2, 5000)], 10, arrival_s=0.0)]
    chunked = run(reqs)
    whole = run(reqs, chunked_prefill=False)
    cost = make_cost_model(MODEL, PROFILE)
    # unchunked: A's iteration holds A alone; B starts after it, whole
    assert whole["ttft_s"][0] == pytest.approx(cost.iteration_time_s([(5000, 0)], []))
    assert whole["scheduled_s"][1] == pytest.approx(whole["first_token_s"][0])
    # chunked: B's first 3192 tokens share A's iteration, so A's first token comes later
    assert chunked["ttft_s"][0] == pytest.approx(cost.iteration_time_s([(5000, 0), (3192, 0)], []))
    assert chunked["ttft_s"][0] > whole["ttft_s"][0]


def test_a_prompt_longer_than_the_budget_is_chunked_even_unchunked() -> None:
    # it could never fit whole: it must still start (and finish) beside a decoding request
    reqs = [Req([(1, 100)], 400, arrival_s=0.0), Req([(2, 20000)], 5, arrival_s=0.01)]
    whole = run(reqs, chunked_prefill=False)
    assert whole["first_token_s"][1] < whole["finish_s"][0]


def test_bad_scheduler_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="num_scheduler_steps"):
        check_fields(EngineConfig(num_scheduler_steps=0))
    with pytest.raises(ConfigError, match="kv_reservation"):
        check_fields(EngineConfig(kv_reservation="some"))


def _engine_file(tmp_path, overlap: bool) -> str:
    """vLLM 0.24's profile with no CPU time per iteration, so that overlapping scheduling
    changes when a request may join, not how long an iteration takes."""
    text = (PROFILES_DIR / "vllm@0.24.toml").read_text(encoding="utf-8")
    for key, value in (
        ("overlap_scheduling", str(overlap).lower()),
        ("iteration_overhead_s", "0.0"),
        ("eager_launch_s", "0.0"),
    ):
        text = re.sub(rf"^{key} = [^\"\n]*$", f"{key} = {value}", text, count=1, flags=re.M)
    path = tmp_path / f"overlap-{overlap}.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_an_engine_that_schedules_ahead_makes_an_arrival_wait_one_more_step(tmp_path):
    """vLLM V1's async scheduling chose the next step's batch when the step in flight began: a
    request arriving while A decodes joins the step after next, one decode step later than
    under the same engine scheduling step by step. An arrival at an idle engine waits for
    nothing either way."""
    reqs = [Req([(1, 100)], 400), Req([(2, 100)], 1, arrival_s=0.5)]
    ttft, tpot = {}, {}
    for overlap in (False, True):
        config = EngineConfig(engine=_engine_file(tmp_path, overlap))
        rows = simulate(make_trace(reqs), MODEL, PROFILE, config).requests.to_pydict()
        ttft[overlap], tpot[overlap] = rows["ttft_s"], rows["tpot_s"]
    assert ttft[True][0] == ttft[False][0]  # A arrived at an idle engine
    step = tpot[False][0]  # A's decode step, nearly constant at batch 1
    assert ttft[True][1] - ttft[False][1] == pytest.approx(step, rel=0.05)

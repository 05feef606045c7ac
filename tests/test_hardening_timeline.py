"""Issue 25, item 1: the sampled timeline never skips a busy stretch, and stays bounded.

With sparse arrivals the timeline used to record an arrival before the request reached a queue
(it sat in the serving front end), judge the system idle, and sleep through the whole request:
`kvsim run --trace sharegpt --max-requests 20 --rate 0.01` wrote 20 rows, none with a running
request or a used HBM block.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.engine import EngineConfig
from kvsim.run import RunConfig, run


def _columns(result) -> dict[str, np.ndarray]:
    t = result.timeline
    return {name: t.column(name).to_numpy() for name in t.column_names}


def _stays(result) -> list[tuple[float, float]]:
    r = result.requests
    done = r.column("status").to_numpy(zero_copy_only=False) == "completed"
    arrival = r.column("arrival_s").to_numpy()[done]
    finish = r.column("finish_s").to_numpy()[done]
    return list(zip(arrival.tolist(), finish.tolist(), strict=True))


def _sparse(**engine) -> RunConfig:
    return RunConfig(trace="sharegpt", max_requests=20, rate=0.01, engine=EngineConfig(**engine))


def test_sparse_arrivals_show_every_request():
    """The issue's run: rows show running requests and used HBM blocks, and every request's
    stay is covered by a row whose in_system_max counts it."""
    result = run(_sparse()).result
    c = _columns(result)
    assert c["running"].max() >= 1 and c["hbm_used_blocks"].max() > 0
    time_s, peak = c["time_s"], c["in_system_max"]
    previous = np.concatenate(([-np.inf], time_s[:-1]))
    for arrival, finish in _stays(result):
        # the rows whose interval (previous row, row] overlaps the stay
        covering = (time_s >= arrival) & (previous <= finish)
        assert covering.any() and peak[covering].max() >= 1, (arrival, finish)
        if finish - arrival > 1.5:  # longer than the interval: a point sample sees it
            inside = (time_s > arrival) & (time_s < finish)
            busy = c["running"] + c["waiting"] + c["loading"]
            assert inside.any() and busy[inside].max() >= 1, (arrival, finish)


def test_timeline_samples_through_every_stay_of_a_pd_run():
    """Under P/D a request also spends time between replicas (its KV on the way), in no queue:
    the timeline keeps sampling through it instead of sleeping until the next arrival."""
    result = run(_sparse(pd="1:1")).result
    c = _columns(result)
    time_s = c["time_s"]
    for arrival, finish in _stays(result):
        if finish - arrival > 1.5:
            inside = (time_s > arrival) & (time_s < finish)
            assert inside.any() and c["in_system_max"][inside].min() >= 1, (arrival, finish)


def test_in_system_max_is_never_below_a_point_sample():
    """A maximum over the interval is at least what any instant of it shows (a request a row
    sees as waiting, running or loading is in the system)."""
    result = run(RunConfig(trace="sharegpt", max_requests=200)).result
    c = _columns(result)
    seen = c["running"] + c["waiting"] + c["loading"]
    assert (c["in_system_max"] >= seen).all()
    assert c["in_system_max"].max() >= 2


def test_idle_stretches_still_cost_one_row():
    """Sleeping through idle stretches is kept: a day between two requests is a handful of
    rows, and the arrival that ends it is sampled at once."""
    from helpers import Req, make_trace

    from kvsim.engine import simulate
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    day = 86_400.0
    reqs = [Req([(1, 500)], 20, arrival_s=0.0), Req([(2, 500)], 20, arrival_s=day)]
    result = simulate(
        make_trace(reqs), load_model("llama-3.1-8b"), load_profile("h100-sxm"), EngineConfig()
    )
    c = _columns(result)
    assert len(c["time_s"]) < 20 and day in c["time_s"].tolist()
    assert c["in_system_max"].max() == 1


def test_the_timeline_is_bounded(monkeypatch):
    """At its cell bound the timeline halves its rows and samples half as often: a run of any
    simulated length (a profile with very slow hardware, an overloaded fleet) keeps a bounded
    table instead of growing until MemoryError."""
    import kvsim.metrics.timeline as timeline

    config = RunConfig(
        trace="mooncake-conversation",
        max_requests=150,
        engine=EngineConfig(tiers="hbm,dram", num_gpu_blocks=1500),
    )
    full = run(config).result.timeline
    monkeypatch.setattr(timeline, "MAX_CELLS", 1)
    monkeypatch.setattr(timeline, "MIN_ROWS", 32)
    small = run(config).result.timeline
    assert full.num_rows > 64 and 32 >= small.num_rows > 8
    assert full.column_names == small.column_names
    assert (np.diff(small.column("time_s").to_numpy()) > 0).all()
    peak = "in_system_max"
    assert small.column(peak).to_numpy().max() == full.column(peak).to_numpy().max()
    busy = small.column("dram_link_busy").to_numpy()
    assert ((busy >= 0) & (busy <= 1)).all() and busy.max() > 0


def test_halving_keeps_each_intervals_maximum_and_mean_busy():
    """Halving keeps the later row of each pair as the point sample, the larger maximum, and
    each link's busy fraction weighted by the time each row stood for."""
    import simpy

    from kvsim.metrics.timeline import Timeline

    t = Timeline(simpy.Environment(), [], 1.0, lambda: 0)
    t.columns = {
        "time_s": [1.0, 2.0, 3.0, 7.0],
        "running": [1, 2, 0, 3],
        "in_system_max": [4, 2, 1, 5],
        "dram_link_busy": [1.0, 0.0, 0.5, 0.25],
    }
    t._elapsed = [1.0, 1.0, 1.0, 4.0]
    t._halve()
    assert t.columns == {
        "time_s": [2.0, 7.0],
        "running": [2, 3],
        "in_system_max": [4, 5],
        "dram_link_busy": [0.5, (0.5 * 1 + 0.25 * 4) / 5],
    }
    assert t._elapsed == [2.0, 5.0] and t.interval_s == 2.0


@pytest.mark.parametrize("interval", [1, 0.25])
def test_a_whole_number_interval_is_fine(interval):
    """A config may give the interval as an int (TOML ``timeline_interval_s = 1``)."""
    config = RunConfig(
        trace="sharegpt", max_requests=30, engine=EngineConfig(timeline_interval_s=interval)
    )
    t = run(config).result.timeline
    assert t.num_rows > 1

"""Arrival models: rates and burstiness as asked, and sessions keep turn order and think times."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import KvsimError
from kvsim.traces import traces_dir, validate_trace
from kvsim.traces.arrivals import (
    GammaProcess,
    PoissonProcess,
    ServeGenProcess,
    read_servegen_windows,
)
from kvsim.traces.registry import load_trace


def test_poisson_and_gamma_rate_and_cv():
    for proc, cv in ((PoissonProcess(4.0, 1), 1.0), (GammaProcess(4.0, 3.0, 1), 3.0)):
        gaps = np.diff(np.concatenate([proc.draw(50_000), proc.draw(50_000)]))
        assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_draw_in_batches_equals_one_draw():
    a = GammaProcess(2.0, 2.0, 7)
    b = GammaProcess(2.0, 2.0, 7)
    assert np.allclose(np.concatenate([a.draw(10), a.draw(990)]), b.draw(1000), rtol=1e-12)
    windows = read_servegen_windows(traces_dir() / "servegen/language-m-large/chunk-104-trace.csv")
    s1, s2 = ServeGenProcess(windows, 3), ServeGenProcess(windows, 3)
    assert np.array_equal(np.concatenate([s1.draw(100), s1.draw(5000)]), s2.draw(5100))


def test_servegen_follows_window_rates():
    path = traces_dir() / "servegen/language-m-large/chunk-104-trace.csv"
    windows = read_servegen_windows(path)
    active = [w for w in windows if w.family]
    times = ServeGenProcess(windows, 0).draw(200_000)
    assert times[0] == 0 and (np.diff(times) >= 0).all()
    # Counts per 600 s window follow the real per-window rates (mean over the windows covered).
    origin = active[0].start_s
    covered = [w for w in windows if origin <= w.start_s < origin + times[-1] - 600]
    expected = sum(w.rate * 600 for w in covered if w.family)
    got = np.sum(times < covered[-1].start_s + 600 - origin)
    assert got == pytest.approx(expected, rel=0.05)
    gaps = np.diff(times[times < 3600])
    assert gaps.std() / gaps.mean() > 1.2  # bursty, unlike Poisson


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "servegen", "replay"])
def test_sessions_keep_turn_order_and_think_times(arrival):
    base = load_trace("sharegpt", seed=2)
    kwargs = {"cv": 4.0} if arrival == "gamma" else {}
    tr = load_trace("sharegpt", seed=2, arrival=arrival, rate=2.0, **kwargs)
    validate_trace(tr.table, arrival)
    key = lambda t: {  # noqa: E731
        (r["session_id"], r["turn"]): r for r in t.table.to_pylist()
    }
    a, b = key(base), key(tr)
    assert a.keys() == b.keys()
    for k, row in b.items():
        assert row["think_time_s"] == a[k]["think_time_s"]
        assert row["segments"] == a[k]["segments"]
        if k[1] > 0:
            prev_gap = a[k]["arrival_s"] - a[(k[0], k[1] - 1)]["arrival_s"]
            assert row["arrival_s"] - b[(k[0], k[1] - 1)]["arrival_s"] == pytest.approx(prev_gap)
    assert tr.table.equals(
        load_trace("sharegpt", seed=2, arrival=arrival, rate=2.0, **kwargs).table
    )


def test_arrival_rate_on_replayed_trace():
    tr = load_trace("azure-code", arrival="poisson", rate=10.0, seed=1)
    arrival = tr.table.column("arrival_s").to_numpy()
    assert len(tr) / arrival.max() == pytest.approx(10.0, rel=0.05)
    fast = load_trace("azure-code", rate_scale=2.0).table.column("arrival_s").to_numpy()
    slow = load_trace("azure-code").table.column("arrival_s").to_numpy()
    assert np.allclose(fast, slow / 2)


def test_bad_arrival_options():
    with pytest.raises(KvsimError, match="option 'arrival': unknown model 'weibull'"):
        load_trace("sharegpt", arrival="weibull")
    with pytest.raises(KvsimError, match="option 'cv' applies only"):
        load_trace("sharegpt", arrival="poisson", cv=2.0)
    with pytest.raises(KvsimError, match="no ServeGen client"):
        load_trace("sharegpt", arrival="servegen:language-m-large/chunk-999")

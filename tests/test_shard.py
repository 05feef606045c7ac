"""Time-sharded runs (kvsim.shard): one shard is the unsharded run; more count every request
once, keep the unsharded files and keys, say they approximate; bad input is one line."""

from __future__ import annotations

import itertools
import json
import math
import sys

import numpy as np
import pyarrow as pa
import pytest
from helpers import in_process

from kvsim.engine import EngineConfig
from kvsim.errors import ConfigError
from kvsim.run import RunConfig, run, write_outputs
from kvsim.shard import Sharding, run_split, windows
from kvsim.shard.windows import check_sharding

#: summary keys a sharded run adds, and those that measure this machine, not the simulation
SHARD_KEYS = {
    "shards",
    "warmup_s",
    "sharding",
    "shard_wall_s",
    "shard_cpu_s",
    "shard_peak_rss_bytes",
}
WALL = {"wall_s"}


def _fleet(n: int = 240, **engine) -> RunConfig:
    # sessions stay on one replica: a round-robin fleet's hits depend on which replica each
    # turn happens to land on, which any change of order reshuffles (bench_shards measures
    # that at scale)
    settings = {
        "replicas": 3,
        "tiers": "hbm,dram",
        "num_gpu_blocks": 600,
        "router": "session",
        **engine,
    }
    return RunConfig(trace="sharegpt", max_requests=n, engine=EngineConfig(**settings))


@pytest.fixture(scope="module")
def unsharded():
    return run(_fleet())


def _same_summary(a: dict, b: dict) -> None:
    drop = SHARD_KEYS | WALL
    assert {k: v for k, v in a.items() if k not in drop} == {
        k: v for k, v in b.items() if k not in drop
    }


def test_one_shard_is_the_unsharded_run_bit_for_bit(unsharded) -> None:
    one = run_split(_fleet(), Sharding(1, warmup_s=30))
    assert one.result.requests.equals(unsharded.result.requests)
    assert one.result.timeline.equals(unsharded.result.timeline)
    _same_summary(one.summary, unsharded.summary)
    assert one.summary["shards"] == 1 and "sharding" not in one.summary


@pytest.mark.parametrize("engine", [{"pd": "1:2"}, {"compression": "quant"}])
def test_one_shard_of_what_cannot_be_split_is_still_the_run(engine) -> None:
    config = _fleet(60, **engine)
    _same_summary(run_split(config, Sharding(1)).summary, run(config).summary)


def test_shards_count_every_request_once_and_keep_the_files(unsharded, tmp_path) -> None:
    sharded = run_split(_fleet(), Sharding(3, warmup_s=20, jobs=1))
    a, b = sharded.result.requests, unsharded.result.requests
    assert a.schema == b.schema
    assert a.column("request_id").equals(b.column("request_id"))
    assert set(sharded.summary) == set(unsharded.summary) | SHARD_KEYS
    assert sharded.summary["completed"] == unsharded.summary["completed"]
    assert sharded.summary["input_tokens"] == unsharded.summary["input_tokens"]
    assert sharded.summary["sharding"].startswith("approximate")
    assert len(sharded.summary["shard_wall_s"]) == 3
    # the fleet's counters are counted over windows that partition the clock
    assert sharded.summary["iterations"] == pytest.approx(unsharded.summary["iterations"], 0.05)
    assert sharded.summary["tiers"].keys() == unsharded.summary["tiers"].keys()
    # and the approximation is close on this small, lightly loaded fleet
    hit, base = sharded.summary["prefix_hit_ratio"], unsharded.summary["prefix_hit_ratio"]
    assert abs(hit - base) < 0.01
    assert sharded.summary["ttft_p50_s"] == pytest.approx(unsharded.summary["ttft_p50_s"], 0.05)
    out = write_outputs(sharded, tmp_path / "sharded")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["requests.parquet", "timeline.parquet", "config.toml", "summary.json", "COMPLETE"]
    )


def test_worker_processes_give_the_same_result_as_one_process() -> None:
    config = _fleet(120)
    here = run_split(config, Sharding(2, warmup_s=10, jobs=1))
    pool = run_split(config, Sharding(2, warmup_s=10, jobs=2))
    assert here.result.requests.equals(pool.result.requests)
    _same_summary(here.summary, pool.summary)


def test_ray_gives_the_same_result_as_local_processes() -> None:
    pytest.importorskip("ray")
    config = _fleet(120)
    local = run_split(config, Sharding(2, warmup_s=10, jobs=1))
    ray = run_split(config, Sharding(2, warmup_s=10, executor="ray", jobs=2))
    assert local.result.requests.equals(ray.result.requests)
    _same_summary(local.summary, ray.summary)


def test_windows_partition_the_trace_by_request_count() -> None:
    arrival = np.sort(np.random.default_rng(1).exponential(1.0, 1000).cumsum())
    cut = windows(arrival, 4, 5.0, "t")
    assert cut[0].start_s == -math.inf and cut[-1].end_s == math.inf
    for a, b in itertools.pairwise(cut):
        assert a.end_s == b.start_s
    counts = [int(((arrival >= w.start_s) & (arrival < w.end_s)).sum()) for w in cut]
    assert sum(counts) == 1000 and max(counts) - min(counts) <= 1
    assert all(w.warmup_s == 5.0 for w in cut)


def test_windows_move_cuts_past_requests_arriving_together() -> None:
    arrival = np.array([0.0] * 6 + [1.0, 2.0, 3.0])
    cut = windows(arrival, 3, 0.0, "t")
    edges = [w.start_s for w in cut[1:]]
    assert edges == sorted(set(edges))
    with pytest.raises(ConfigError, match="distinct arrival times"):
        windows(np.zeros(10), 2, 0.0, "t")


@pytest.mark.parametrize(
    ("shards", "warmup", "match"),
    [
        (0, 0.0, "--shards"),
        (True, 0.0, "--shards"),
        (2.5, 0.0, "--shards"),
        (2, -1.0, "--warmup"),
        (2, math.inf, "--warmup"),
        (2, math.nan, "--warmup"),
    ],
)
def test_bad_sharding_settings_are_named(shards, warmup, match) -> None:
    with pytest.raises(ConfigError, match=match):
        check_sharding(shards, warmup)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shards", "0"], "--shards: expected an integer"),
        (["--shards", "2", "--warmup", "-5"], "--warmup: expected seconds >= 0"),
        (["--shards", "60", "--max-requests", "50"], "give at most 50 shards"),
        (["--shards", "2", "--pd", "1:1", "--replicas", "2"], "disaggregation"),
        (["--executor", "ray"], "only with --shards"),
    ],
)
def test_bad_sharded_runs_are_one_line_exit_2_nothing_written(
    capsys, tmp_path, args, message
) -> None:
    out = tmp_path / "out"
    code, _, err = in_process(capsys, "run", *args, "--out", str(out))
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.iterdir())


def test_ray_missing_is_one_line_before_anything_runs(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    out = tmp_path / "out"
    code, _, err = in_process(
        capsys, "run", "--shards", "2", "--executor", "ray", "--out", str(out)
    )
    assert code == 2 and "pip install 'kvsim[ray]'" in err
    assert not list(tmp_path.iterdir())


def test_a_failing_window_fails_the_run_with_its_number(monkeypatch) -> None:
    import kvsim.shard.run as shard_run

    real = shard_run.run_window

    def broken(trace, run_, window, progress=None):
        if window.start_s > -math.inf:
            raise ConfigError("row 7: broken on purpose")
        return real(trace, run_, window, progress)

    monkeypatch.setattr(shard_run, "run_window", broken)
    with pytest.raises(shard_run.ShardError, match=r"shard 2 of 2: row 7: broken on purpose"):
        run_split(_fleet(60), Sharding(2, jobs=1))


def test_merged_requests_are_in_trace_order(unsharded) -> None:
    sharded = run_split(_fleet(), Sharding(4, warmup_s=0, jobs=1))
    ids = sharded.result.requests.column("request_id")
    assert ids.equals(unsharded.result.requests.column("request_id"))
    assert isinstance(sharded.result.requests, pa.Table)


def test_closed_loop_turns_are_retimed_by_the_runs_own_model() -> None:
    from helpers import Req, make_trace

    from kvsim.costmodel import make_cost_model
    from kvsim.hardware import load_profile
    from kvsim.models import load_model
    from kvsim.shard.retime import retimed, service_s

    rows = [
        Req([(1, 64)], 50, arrival_s=5.0, session_id=0, turn=0),
        Req([(1, 64), (2, 30)], 20, arrival_s=99.0, session_id=0, turn=1, think_time_s=3.0),
        Req([(3, 40)], 10, arrival_s=7.0, session_id=1, turn=0),
        Req([(1, 64), (2, 30), (4, 8)], 5, arrival_s=99.0, session_id=0, turn=2, think_time_s=1.0),
    ]
    trace = make_trace(rows)
    cost = make_cost_model(load_model("llama-3.2-1b"), load_profile("h100-sxm"))
    table = retimed(trace, cost, 8192).table
    ids, times = table.column("request_id").to_pylist(), table.column("arrival_s").to_pylist()
    at = dict(zip(ids, times, strict=True))
    new = [at[i] for i in range(4)]
    service = service_s(cost, np.array([64, 94]), np.array([50, 20]), 8192)
    assert new[0] == 5.0 and new[2] == 7.0  # open-loop rows keep their times
    assert new[1] == pytest.approx(5.0 + service[0] + 3.0)
    assert new[3] == pytest.approx(new[1] + service[1] + 1.0)
    assert service[0] > 49 * cost.iteration_time_s([], [64])  # a step per further reply token


def _plan(runner):
    from kvsim.plan import PlanSettings, parse_rates, resolve_rates, run_plan

    base = RunConfig(trace="mooncake-conversation", max_requests=60)
    settings = PlanSettings(
        base, 12.0, 0.25, routers=("round-robin",), max_replicas=8, search_tiers=("dram",)
    )
    return run_plan(settings, resolve_rates(parse_rates("1x"), 1.0), runner)


def test_a_plan_of_one_shard_runs_is_the_unsharded_plan() -> None:
    from kvsim.plan import plan_json
    from kvsim.plan.runner import ShardedRunner, serial_runner

    with ShardedRunner(Sharding(1), "local", jobs=1) as runner:
        sharded = json.loads(plan_json(_plan(runner)))
    plain = json.loads(plan_json(_plan(serial_runner)))
    assert _no_wall(sharded) == _no_wall(plain)


def _no_wall(value):
    """`value` without its wall-clock times (they measure this machine)."""
    if isinstance(value, dict):
        return {k: _no_wall(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [_no_wall(v) for v in value]
    return value


def test_plan_shards_on_the_command_line(capsys) -> None:
    code, out, err = in_process(
        capsys,
        "plan",
        "--trace",
        "mooncake-conversation",
        "--max-requests",
        "60",
        "--rates",
        "1x",
        "--slo-ttft-p99",
        "12",
        "--slo-tpot-p99",
        "0.25",
        "--routers",
        "round-robin",
        "--shards",
        "2",
        "--warmup",
        "20",
        "-j",
        "1",
        "--json",
    )
    assert code == 0, err
    plan = json.loads(out)
    assert plan["frontier"]
    bad = ["plan", "--trace", "x", "--rates", "1x", "--slo-ttft-p99", "1", "--slo-tpot-p99", "1"]
    code, _, err = in_process(capsys, *bad, "--shards", "0")
    assert code == 2 and "--shards" in err

"""kvsim sweep: spec expansion, resume, failures, bad specs, and equal tables on every executor."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import sys
import tomllib

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.errors import ConfigError
from kvsim.run import RunConfig, is_complete
from kvsim.sweep import (
    MEASURED_COLUMNS,
    SweepError,
    expand_spec,
    load_spec,
    open_executor,
    results_table,
    run_many,
    run_sweep,
)
from kvsim.sweep import worker as worker_module
from kvsim.sweep.progress import SweepProgress
from kvsim.sweep.worker import Task, run_task

ISSUE_SPEC = """\
[base]
trace = "mooncake-conversation"
max_requests = 2000
[grid]            # every combination
policy = ["lru", "s3fifo"]
replicas = [1, 2]
"""
SMALL = {"base": {"trace": "mooncake-conversation", "max_requests": 40}}


def stable(table: pd.DataFrame) -> pd.DataFrame:
    """The table without the columns that measure the machine."""
    return table.drop(columns=[c for c in MEASURED_COLUMNS if c in table.columns])


def kvsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvsim", *args], capture_output=True, text=True, timeout=300
    )


def test_issue_example_spec_runs(tmp_path):
    """The issue's spec, cut to 80 requests, from the command line on a pool of two."""
    spec = tmp_path / "spec.toml"
    spec.write_text(ISSUE_SPEC.replace("2000", "80"))
    assert [c.params for c in load_spec(spec)] == [
        {"policy": "lru", "replicas": 1},
        {"policy": "lru", "replicas": 2},
        {"policy": "s3fifo", "replicas": 1},
        {"policy": "s3fifo", "replicas": 2},
    ]
    out = tmp_path / "sweep"
    proc = kvsim("sweep", str(spec), "--out", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal
    assert "4 configurations (0 resumed, 0 failed)" in proc.stdout
    table = pd.read_parquet(out / "results.parquet")
    assert list(table["policy"]) == ["lru", "lru", "s3fifo", "s3fifo"]
    assert list(table["replicas"]) == [1, 2, 1, 2]
    assert (table["status"] == "ok").all() and table["error"].isna().all()
    assert (table["requests"] == 80).all()
    for column in ("ttft_p99_s", "tpot_p99_s", "throughput_tokens_per_s", "prefix_hit_ratio",
                   "cost_per_million_tokens_usd", "wall_s", "sweep.peak_rss_bytes"):  # fmt: skip
        assert table[column].notna().all(), column
    assert (table["sweep.peak_rss_bytes"] > 10 * 2**20).all()
    for cid in table["id"]:
        folder = out / "runs" / cid
        assert is_complete(folder)
        assert not (folder / "requests.parquet").exists()  # only with --keep-requests
        saved = json.loads((folder / "summary.json").read_text())
        assert saved["ttft_p99_s"] == table.set_index("id").loc[cid, "ttft_p99_s"]
    assert (out / "spec.toml").read_text() == spec.read_text()
    # the full-size spec expands the same way
    full = tmp_path / "full.toml"
    full.write_text(ISSUE_SPEC)
    assert [c.config.max_requests for c in load_spec(full)] == [2000] * 4


def test_grid_zip_and_list_expansion():
    grid = expand_spec({**SMALL, "grid": {"policy": ["lru", "arc"], "seed": [0, 1, 2]}})
    assert [c.params for c in grid] == [
        {"policy": p, "seed": s} for p in ("lru", "arc") for s in (0, 1, 2)
    ]
    assert [(c.config.engine.policy, c.config.engine.seed) for c in grid] == [
        (c.params["policy"], c.params["seed"]) for c in grid
    ]
    assert len({c.id for c in grid}) == 6
    zipped = expand_spec({**SMALL, "zip": {"rate_scale": [1, 2], "seed": [3, 4]}})
    assert [c.params for c in zipped] == [
        {"rate_scale": 1.0, "seed": 3},
        {"rate_scale": 2.0, "seed": 4},
    ]
    assert zipped[1].config.rate_scale == 2.0 and zipped[1].config.engine.seed == 4
    listed = expand_spec(
        {**SMALL, "configs": [{"policy": "lru"}, {"router": "least-loaded", "replicas": 2}]}
    )
    assert [c.params for c in listed] == [
        {"policy": "lru", "router": "round-robin", "replicas": 1},
        {"policy": "lru", "router": "least-loaded", "replicas": 2},
    ]
    both = expand_spec(
        {**SMALL, "grid": {"policy": ["lru", "arc"]}, "list": [{"tp": 1}, {"tp": 2}]}
    )
    assert [(c.params["policy"], c.params["tp"]) for c in both] == [
        ("lru", 1), ("lru", 2), ("arc", 1), ("arc", 2)
    ]  # fmt: skip
    assert len(expand_spec(SMALL)) == 1  # the base alone


def test_config_file_tables_and_tier_sizes():
    """[base.engine]-style tables mirror a config file; tier_capacity.<tier> merges per tier."""
    doc = {
        "base": {
            "trace": {"name": "mooncake-conversation", "max_requests": 40},
            "model": {"name": "llama-3.1-8b"},
            "engine": {"tiers": "hbm,dram,nvme", "tier_capacity": "nvme=8TB"},
            "slo": {"ttft_s": 2.0},
        },
        "grid": {"tier_capacity": {"dram": ["256GiB", "1TiB"]}, "engine": {"policy": ["lru"]}},
    }
    configs = expand_spec(doc)
    assert [c.config.engine.tier_capacity for c in configs] == [
        "nvme=8TB,dram=256GiB",
        "nvme=8TB,dram=1TiB",
    ]
    assert configs[0].params == {"tier_capacity.dram": "256GiB", "policy": "lru"}
    assert configs[0].config.slo_ttft_s == 2.0 and configs[0].config.max_requests == 40
    flat = expand_spec({"base": {"trace": "mooncake-conversation", "max_requests": 40,
                                 "tiers": "hbm,dram,nvme", "tier_capacity": "nvme=8TB",
                                 "slo_ttft_s": 2.0, "tier_capacity.dram": "256GiB"}})  # fmt: skip
    assert flat[0].id == configs[0].id  # same config, same id, however it was written


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("[grid]\npolicee = ['lru']\n", "grid.policee: unknown key"),
        ("[grid]\npolicy = []\n", "grid.policy: expected a non-empty list"),
        ("[grid]\n", "[grid] is empty"),
        ("[grid]\nreplicas = ['2']\n", "grid.replicas: expected an integer, got '2'"),
        ("[base]\nrate_scale = 'fast'\n", "base.rate_scale: expected a finite number"),
        ("[zip]\nreplicas = [1, 2]\nseed = [1]\n", "zip.seed: 1 values, but zip.replicas has 2"),
        ("[grid]\nreplicas = [1, 0]\n", "(replicas=0): engine.replicas: expected a positive"),
        ("[grid]\npolicy = ['lru', 'nope']\n", "(policy='nope'): unknown policy 'nope'"),
        ("[base.engine]\nreplicas = 2\n[base.nope]\nx = 1\n", "base.nope: unknown table"),
        ("[grid.tier_capacity]\ndram = ['1TiB', '12']\n", "grid.tier_capacity.dram: '12' has no"),
        ("[sweep]\n", "unknown section [sweep]"),
        ("[[configs]]\nseed = 1\n[[configs]]\nseed = 1\n", "the same configuration as number 1"),
    ],
)
def test_bad_spec_is_one_line_exit_2_and_nothing_run(tmp_path, capsys, spec, message):
    path = tmp_path / "spec.toml"
    base = "" if spec.startswith("[base]") else "[base]\ntrace = 'mooncake-conversation'\n"
    path.write_text(base + spec)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--out", str(out)])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), captured.err
    assert message in lines[0]
    assert not out.exists()  # nothing run, nothing written


def test_interrupted_sweep_resumed_gives_the_same_table(tmp_path):
    configurations = expand_spec(
        {**SMALL, "grid": {"policy": ["lru", "s3fifo"], "replicas": [1, 2], "seed": [0, 1]}}
    )
    whole = run_sweep(configurations, tmp_path / "whole", jobs=1, progress=False)
    assert all(r.ok and not r.resumed for r in whole)
    # interrupted after three configurations: one of them killed while writing its folder
    part = tmp_path / "part"
    run_sweep(configurations[:3], part, jobs=1, progress=False)
    shutil.rmtree(part / "runs" / configurations[1].id)
    (part / "runs" / f"{configurations[1].id}.partial-1-0").mkdir()  # what a kill leaves
    resumed = run_sweep(configurations, part, jobs=2, progress=False)
    assert [r.resumed for r in resumed] == [True, False, True] + [False] * 5
    a = pd.read_parquet(tmp_path / "whole" / "results.parquet")
    b = pd.read_parquet(part / "results.parquet")
    assert list(a.columns) == list(b.columns)
    pd.testing.assert_frame_equal(stable(a), stable(b), check_exact=True)
    again = run_sweep(configurations, part, jobs=2, progress=False)  # everything resumed
    assert all(r.resumed for r in again)
    pd.testing.assert_frame_equal(
        stable(pd.read_parquet(part / "results.parquet")), stable(b), check_exact=True
    )


def test_failing_configuration_is_recorded_and_the_others_finish(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text("this is not a trace\n")
    spec = tmp_path / "spec.toml"
    spec.write_text(
        "[base]\ntrace = 'mooncake-conversation'\nmax_requests = 40\n"
        f"[[configs]]\npolicy = 'lru'\n[[configs]]\ntrace = '{broken}'\n"
        "[[configs]]\npolicy = 'arc'\n"
    )
    out = tmp_path / "out"
    proc = kvsim("sweep", str(spec), "--out", str(out), "-j", "2")
    assert proc.returncode == 2
    err = proc.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("kvsim: error: 1 of 3 configurations failed")
    table = pd.read_parquet(out / "results.parquet")
    assert list(table["status"]) == ["ok", "failed", "ok"]
    assert table["error"][1].startswith(str(broken)) and "\n" not in table["error"][1]
    assert table["ttft_p99_s"].notna().tolist() == [True, False, True]
    assert not (out / "runs" / table["id"][1]).exists()  # a failure is tried again on rerun
    results = run_sweep(spec, out, jobs=1, progress=False)
    assert [(r.status, r.resumed) for r in results] == [
        ("ok", True),
        ("failed", False),
        ("ok", True),
    ]


def test_serial_and_pool_give_identical_tables():
    configs = [RunConfig(trace="mooncake-conversation", max_requests=40, rate_scale=s)
               for s in (1.0, 2.0, 4.0)]  # fmt: skip
    serial = run_many(configs, jobs=1, progress=False)
    pool = run_many(configs, jobs=2, progress=False)
    assert [r.params for r in serial] == [{"rate_scale": s} for s in (1.0, 2.0, 4.0)]
    pd.testing.assert_frame_equal(
        stable(results_table(serial)), stable(results_table(pool)), check_exact=True
    )
    assert len({r.summary["sweep"]["worker"] for r in pool}) >= 1


def test_run_many_keeps_order_runs_equal_configs_once_and_reuses_an_open_executor():
    a = RunConfig(trace="mooncake-conversation", max_requests=30)
    b = RunConfig(trace="mooncake-conversation", max_requests=30, rate_scale=3.0)
    with open_executor("local", jobs=1) as executor:
        results = run_many([b, a, b], executor=executor, progress=False)
        assert [r.id for r in results] == [results[0].id, results[1].id, results[0].id]
        assert results[0] is results[2]
        assert run_many([a], executor=executor, progress=False)[0].summary["requests"] == 30
    with pytest.raises(ConfigError, match=r"configuration rate_scale=-1.0: rate_scale"):
        run_many([a, dataclasses.replace(a, rate_scale=-1.0)], progress=False)


def test_worker_loads_a_trace_once_and_records_its_peak_memory(monkeypatch):
    loads = []
    real = worker_module.load_trace

    def counting(name, **options):
        loads.append(name)
        return real(name, **options)

    monkeypatch.setattr(worker_module, "load_trace", counting)
    monkeypatch.setattr(worker_module, "_traces", type(worker_module._traces)())
    base = RunConfig(trace="mooncake-conversation", max_requests=30)
    for i, policy in enumerate(("lru", "arc", "s3fifo")):
        config = RunConfig(trace=base.trace, max_requests=30,
                           engine=type(base.engine)(policy=policy))  # fmt: skip
        got = run_task(Task(i, str(i), config))
        assert got.error is None and got.peak_rss_bytes > 0
    assert loads == ["mooncake-conversation"]  # loaded once, reused by the other two
    for n in (31, 32, 33):  # the cache is bounded
        run_task(Task(0, "x", RunConfig(trace=base.trace, max_requests=n)))
    assert len(worker_module._traces) == worker_module.TRACE_CACHE_SIZE


def test_kept_requests_carry_each_requests_compression():
    """A sweep's requests.parquet has the columns a run's has (compression, kv_peak_bytes)."""
    engine = dataclasses.replace(RunConfig().engine, compression="quant:k=4,v=4")
    config = RunConfig(trace="mooncake-conversation", max_requests=20, engine=engine)
    got = run_task(Task(0, "q", config, keep_requests=True))
    assert got.error is None
    table = got.tables["requests.parquet"]
    labels = set(table.column("compression").to_pylist())
    assert labels == {"quant:group=32,k=4,residual=128,v=4"}
    assert "kv_peak_bytes" in table.column_names


def test_progress_bar_counts_configurations_with_an_eta():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = SweepProgress(4, resumed=1, stream=stream)
    bar.advance()
    bar.advance(failed=True)
    assert "3/4 configurations, 1 failed" in bar.line() and "ETA" in bar.line()
    bar.close()
    assert stream.getvalue().startswith("\r[") and stream.getvalue().endswith("\n")
    quiet = io.StringIO()  # not a terminal: nothing drawn
    SweepProgress(4, stream=quiet).advance()
    assert quiet.getvalue() == ""


def test_ray_missing_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SweepError, match=r"pip install 'kvsim\[ray\]'"):
        open_executor("ray", jobs=1)


def test_ray_and_local_give_identical_tables(tmp_path):
    pytest.importorskip("ray")
    configurations = expand_spec(
        {**SMALL, "grid": {"policy": ["lru", "s3fifo"], "replicas": [1, 2]}}
    )
    run_sweep(configurations, tmp_path / "local", jobs=2, progress=False)
    ray = run_sweep(configurations, tmp_path / "ray", executor="ray", jobs=2, progress=False)
    assert all(r.ok for r in ray)
    a = pd.read_parquet(tmp_path / "local" / "results.parquet")
    b = pd.read_parquet(tmp_path / "ray" / "results.parquet")
    pd.testing.assert_frame_equal(stable(a), stable(b), check_exact=True)
    config = tomllib.loads((tmp_path / "ray" / "runs" / ray[0].id / "config.toml").read_text())
    assert config["engine"]["policy"] == "lru"

"""Issue 25, results that said too little or the wrong thing: a sweep configuration in which no
request completed, reports of failed and unfinished sweeps, fleets too large for a bar per
replica, and `kvsim compare` tables with repeated or mislabelled rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from helpers import in_process

from kvsim.compare import compare
from kvsim.errors import ConfigError
from kvsim.report import ReportError, write_report
from kvsim.report.data import RunData
from kvsim.report.run_figures import PER_REPLICA_BARS, per_replica
from kvsim.run import RunConfig
from kvsim.sweep import expand_spec, run_many, run_sweep
from kvsim.sweep.spec import flat_config

BASE = {"trace": "mooncake-conversation", "max_requests": 20}
#: A replica of 4 blocks holds no request of this trace: nothing completes (kvsim run exits 2).
STARVED = 4


@pytest.fixture(scope="module")
def mixed_sweep(tmp_path_factory):
    """A sweep of one configuration that completes nothing and one that works."""
    out = tmp_path_factory.mktemp("sweeps") / "mixed"
    spec = expand_spec({"base": BASE, "grid": {"num_gpu_blocks": [STARVED, 4000]}})
    return out, run_sweep(spec, out, jobs=1, progress=False)


# -- a configuration in which nothing completed ----------------------------------------------------
def test_a_sweep_records_a_run_that_completed_nothing_as_failed(mixed_sweep, tmp_path):
    out, results = mixed_sweep
    starved, fine = results
    assert (starved.status, fine.status) == ("failed", "ok")
    assert starved.error.startswith("0 of 20 requests completed") and "\n" not in starved.error
    assert starved.summary["completed"] == 0  # what it did is kept, as kvsim run keeps it
    table = pd.read_parquet(out / "results.parquet")
    assert table["status"].tolist() == ["failed", "ok"]
    assert table["error"][0] == starved.error
    # resumed, it reads back the same way: not run again, still failed
    again = run_sweep(expand_spec({"base": BASE, "grid": {"num_gpu_blocks": [STARVED, 4000]}}),
                      out, jobs=1, progress=False)  # fmt: skip
    assert [(r.status, r.resumed, r.error) for r in again] == [
        ("failed", True, starved.error),
        ("ok", True, None),
    ]
    # and without a folder, as kvsim compare and kvsim plan run it
    alone = run_many([starved.config], jobs=1, progress=False)[0]
    assert (alone.status, alone.error) == ("failed", starved.error)


def test_the_sweep_command_exits_2_for_it(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        "[base]\ntrace = 'mooncake-conversation'\nmax_requests = 20\n"
        f"[grid]\nnum_gpu_blocks = [{STARVED}]\n"
    )
    code, out, err = in_process(capsys, "sweep", str(spec), "--out", str(tmp_path / "s"), "-j", "1")
    assert code == 2
    assert "1 of 1 configurations failed" in err and "0 of 20 requests completed" in err
    assert "0 failed" not in out


# -- reports of sweeps that failed -----------------------------------------------------------------
def test_a_report_says_which_configurations_it_leaves_out(mixed_sweep, tmp_path, capsys):
    out, results = mixed_sweep
    code, _, err = in_process(capsys, "report", str(out), "--out", str(tmp_path / "report"))
    assert code == 0, err
    assert f"warning: configuration {results[0].id} failed, left out of the figures" in err
    assert "no parameter takes two values" in err  # one success: a table, no figure
    assert (tmp_path / "report" / "report.md").is_file()


def test_a_report_of_a_sweep_where_everything_failed_is_an_error(tmp_path, capsys):
    out = tmp_path / "all-failed"
    spec = expand_spec({"base": BASE, "grid": {"num_gpu_blocks": [STARVED, STARVED + 1]}})
    run_sweep(spec, out, jobs=1, progress=False)
    code, _, err = in_process(capsys, "report", str(out))
    assert code == 2
    assert "no configuration succeeded, nothing to report: 2 of 2 failed" in err
    assert len(err.strip().splitlines()) == 1
    assert not (out / "report").exists()
    with pytest.raises(ReportError):
        write_report(out)


def test_a_report_of_an_unfinished_sweep_says_to_finish_it(mixed_sweep, tmp_path, capsys):
    out, _ = mixed_sweep
    cut = tmp_path / "cut"
    shutil.copytree(out, cut, ignore=shutil.ignore_patterns("results.parquet", "report"))
    code, _, err = in_process(capsys, "report", str(cut))
    assert code == 2
    assert "results.parquet: missing; the sweep did not finish" in err
    assert "requests.parquet" not in err  # not mistaken for a run's folder


def test_a_report_of_a_run_that_completed_nothing_says_so(mixed_sweep, tmp_path, capsys):
    starved = mixed_sweep[1][0]
    args = ["run", "--trace", "mooncake-conversation", "--max-requests", "20"]
    args += ["--num-gpu-blocks", str(STARVED), "--out", str(tmp_path / "r")]
    code, _, _ = in_process(capsys, *args)
    assert code == 2  # as the sweep recorded it
    code, _, err = in_process(capsys, "report", str(tmp_path / "r"))
    assert code == 0, err
    assert "no request completed" in err and "figures are empty" in err
    assert starved.error.split(":")[0] in err  # the same reason


# -- a fleet too large for a bar per replica -------------------------------------------------------
def fleet(replicas: int, roles: bool = False) -> RunData:
    """A run's data with `replicas` per-replica rows (figures read only the summary)."""
    rows = [
        {
            "replica": i,
            "role": ("prefill" if i % 4 == 0 else "decode") if roles else None,
            "requests": i % 7,
            "completed": i % 7,
            "busy_fraction": (i % 10) / 10,
            "prefix_hit_ratio": (i % 5) / 5,
            "ttft_p50_s": None if i % 7 == 0 else 0.1 + i / 1e4,
            "ttft_p99_s": None if i % 7 == 0 else 0.5 + i / 1e4,
        }
        for i in range(replicas)
    ]
    summary = {"trace": "t", "model": "m", "hardware": "h", "policy": "lru"}
    summary |= {"replicas": replicas, "router": "round-robin", "per_replica": rows}
    empty = pa.table({"x": pa.array([], pa.float64())})
    return RunData(Path("."), empty, empty, summary, "")


def test_a_large_fleet_is_drawn_as_its_spread_across_replicas():
    big = per_replica(fleet(1000))
    assert sum(len(ax.patches) for ax in big.axes) == 0  # no bar per replica
    assert sum(len(ax.lines) for ax in big.axes) == 6  # a sorted curve per figure
    assert sum(len(ax.texts) for ax in big.axes) == 0  # no value label per replica
    assert "spread across 1,000 replicas" in big._suptitle.get_text()
    ttft = big.axes[3].get_legend().get_texts()[0].get_text()
    assert ttft.startswith("TTFT p50: median") and "(the 857 with a value)" in ttft
    roles = per_replica(fleet(1000, roles=True))
    assert sum(len(ax.lines) for ax in roles.axes) == 12  # a curve per role
    small = per_replica(fleet(PER_REPLICA_BARS))
    assert sum(len(ax.patches) for ax in small.axes) == 6 * PER_REPLICA_BARS  # bars up to there


# -- kvsim compare ---------------------------------------------------------------------------------
def test_compare_refuses_a_value_given_twice(capsys):
    code, _, err = in_process(capsys, "compare", "--max-requests", "5", "--vary", "policy=lru,lru")
    assert code == 2 and "vary policy: 'lru' given twice" in err
    with pytest.raises(ConfigError, match=r"'1\.0' given twice"):
        compare(RunConfig(max_requests=5), {"rate_scale": ["1", "1.0"]})  # one number


def test_a_baseline_on_another_key_is_labelled_with_it():
    base = RunConfig(**BASE)
    default = flat_config(base)["replicas"]
    table = compare(base, {"policy": ["lru", "fifo"]}, baseline={"replicas": 2}, jobs=1)
    assert [r.params for r in table.rows] == [
        {"policy": "lru", "replicas": default},
        {"policy": "fifo", "replicas": default},
        {"policy": "lru", "replicas": 2},
    ]
    assert [r.baseline for r in table.rows] == [False, False, True]
    lines = table.format().splitlines()
    assert lines[0].split()[:2] == ["policy", "replicas"]
    assert lines[3].startswith("lru (baseline)  2 ")
    records = json.loads(table.to_json())["rows"]
    assert records[2]["replicas"] == 2 and records[2]["baseline"] is True

"""`kvsim compare` and `kvsim run --baseline`: their ratios are the ratios of the runs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvsim.cli import main
from kvsim.compare import compare, figures
from kvsim.engine.config import EngineConfig
from kvsim.errors import ConfigError
from kvsim.run import RunConfig, run

BASE = RunConfig(trace="sharegpt", max_requests=150)


def direct(**engine: object) -> dict[str, float | None]:
    """The figures of one run made with kvsim.run.run, not through compare."""
    config = dataclasses.replace(BASE, engine=EngineConfig(**engine))  # type: ignore[arg-type]
    return figures(run(config).summary)


def test_compare_ratios_are_the_ratios_of_the_runs():
    vary = {"policy": ["lru", "fifo"], "tiers": ["hbm", "hbm,dram"]}
    table = compare(BASE, vary, baseline={"policy": "fifo", "tiers": "hbm"}, jobs=1)
    assert [r.params for r in table.rows] == [
        {"policy": p, "tiers": t} for p in vary["policy"] for t in vary["tiers"]
    ]
    assert [r.baseline for r in table.rows] == [False, False, True, False]
    ref = direct(policy="fifo", tiers="hbm")
    checked = 0
    for row in table.rows:
        own = direct(**row.params)
        assert row.figures == {k: own.get(k) for k in table.keys}
        for key in table.keys:
            if own.get(key) is None or not ref.get(key):
                assert row.ratios[key] is None
            else:
                assert row.ratios[key] == pytest.approx(own[key] / ref[key], rel=1e-12)
                checked += 1
    assert checked >= 4 * 8
    assert "hit_ratio.dram" in table.keys and "hit_ratio.hbm" in table.keys


def test_a_baseline_outside_the_grid_runs_as_its_own_row():
    table = compare(BASE, {"policy": ["lru"]}, baseline={"policy": "fifo"}, jobs=1)
    assert [(r.params, r.baseline) for r in table.rows] == [
        ({"policy": "lru"}, False),
        ({"policy": "fifo"}, True),
    ]
    assert all(v in (None, 1.0) for v in table.rows[1].ratios.values())
    records = json.loads(table.to_json())["rows"]
    assert records[0]["ttft_p99_s_ratio"] == table.rows[0].ratios["ttft_p99_s"]
    assert table.to_markdown().count("\n") == 3  # head, rule, two rows


def test_compare_refuses_an_unknown_key():
    with pytest.raises(ConfigError, match="vary colour: unknown key"):
        compare(BASE, {"colour": ["red"]}, jobs=1)


def test_cli_compare_markdown_and_bad_vary(capsys):
    main(["compare", "--max-requests", "100", "--vary", "tiers=hbm,hbm+dram", "-j", "1",
          "--markdown"])  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| tiers |") and len(lines) == 4
    assert lines[3].startswith("| hbm,dram |")
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--vary", "policy"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "kvsim: error: --vary: expected KEY=VALUE,VALUE, got 'policy'"
    ]


def test_run_baseline_prints_the_ratios_of_both_runs(tmp_path, capsys):
    out = tmp_path / "run"
    main(["run", "--max-requests", "150", "--tiers", "hbm", "--num-gpu-blocks", "1000",
          "--policy", "fifo", "--baseline", "lru", "--out", str(out), "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["policy"] == "fifo" and doc["baseline"]["policy"] == "lru"
    mine, theirs = (
        direct(policy="fifo", tiers="hbm", num_gpu_blocks=1000),
        direct(policy="lru", tiers="hbm", num_gpu_blocks=1000),
    )
    assert mine["ttft_p99_s"] == doc["run"]["ttft_p99_s"]
    assert doc["ratios"]["ttft_p99_s"] == pytest.approx(mine["ttft_p99_s"] / theirs["ttft_p99_s"])
    assert doc["ratios"]["hit_ratio.hbm"] == pytest.approx(
        mine["hit_ratio.hbm"] / theirs["hit_ratio.hbm"]
    )
    assert doc["ratios"]["hit_ratio.hbm"] != 1.0  # the two policies differ at this size
    assert (tmp_path / "run-baseline" / "summary.json").is_file()

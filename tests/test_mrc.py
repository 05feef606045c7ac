"""`kvsim mrc`: the command, its JSON, its plot and its errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvsim.errors import KvsimError
from kvsim.mrc.cli import mrc

ARGS = ["--trace", "mooncake-synthetic", "--max-requests", "300"]


def test_json_and_plot(tmp_path) -> None:
    png = tmp_path / "mrc.png"
    out = CliRunner().invoke(
        mrc,
        [
            *ARGS,
            "--policy",
            "lru,belady,bayes-reuse",
            "--capacity",
            "100,1000",
            "--semantics",
            "prefix",
            "--json",
            "--plot",
            str(png),
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert set(doc) == {"results", "wall_s"}
    rows = doc["results"]
    assert len(rows) == 6
    fields = {"policy", "capacity", "semantics", "accesses", "hits", "hit_ratio"}
    # prefix semantics runs requests through the engine's pool: one longer than it is refused
    assert set(rows[0]) == fields | {"unserved_requests"}
    assert rows[0]["unserved_requests"] > 0 and rows[1]["unserved_requests"] == 0
    assert all(r["semantics"] == "prefix" and r["hits"] <= r["accesses"] for r in rows)
    assert png.stat().st_size > 1000


def test_ema_head_reports_attention_mass_lost() -> None:
    out = CliRunner().invoke(
        mrc, [*ARGS, "--policy", "lru,ema-head", "--capacity", "200", "--json"]
    )
    assert out.exit_code == 0, out.output
    lru, ema = json.loads(out.output)["results"]
    assert "attention_mass_lost" not in lru
    assert ema["attention_mass_lost"] == 0.0 and ema["lossy_hits"] == 0  # lossless default


def test_prefix_never_beats_plain() -> None:
    runs = {}
    for sem in ("plain", "prefix"):
        out = CliRunner().invoke(
            mrc, [*ARGS, "--policy", "lru", "--capacity", "500", "--semantics", sem, "--json"]
        )
        runs[sem] = json.loads(out.output)["results"][0]["hits"]
    assert runs["prefix"] <= runs["plain"]


@pytest.mark.parametrize("bad", [["--capacity", "0"], ["--capacity", "lots"], ["--policy", "nope"]])
def test_bad_input_is_a_user_error(bad: list[str]) -> None:
    args = {"--policy": "lru", "--capacity": "10"}
    args.update(dict(zip(bad[::2], bad[1::2], strict=True)))
    out = CliRunner().invoke(mrc, [*ARGS, *[x for kv in args.items() for x in kv]])
    assert isinstance(out.exception, KvsimError)

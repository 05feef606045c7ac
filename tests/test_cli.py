"""End-to-end CLI runs on the shipped traces, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pyarrow.parquet as pq
import pytest

KEYS = {
    "requests",
    "completed",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "e2e_p50_s",
    "throughput_tokens_per_s",
    "prefix_hit_ratio",
    "simulated_s",
    "wall_s",
}


def kvsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvsim", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("trace", ["sharegpt", "mooncake-conversation"])
def test_run_json_on_both_traces(tmp_path, trace):
    out = tmp_path / "run"
    proc = kvsim(
        "run",
        "--trace",
        trace,
        "--policy",
        "lru",
        "--max-requests",
        "150",
        "--out",
        str(out),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary.keys() >= KEYS
    assert summary["requests"] == 150 and summary["completed"] == 150
    assert 0 <= summary["prefix_hit_ratio"] <= 1
    assert summary["ttft_p50_s"] <= summary["ttft_p99_s"]
    table = pq.read_table(out / "requests.parquet")
    assert table.num_rows == 150
    for column in (
        "request_id",
        "arrival_s",
        "first_token_s",
        "finish_s",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "input_tokens",
        "cached_tokens",
        "output_tokens",
        "preemptions",
    ):
        assert column in table.column_names
    assert json.loads((out / "summary.json").read_text()) == summary
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["trace"]["name"] == trace and config["engine"]["policy"] == "lru"


def test_resolved_config_reproduces_the_run(tmp_path):
    first = kvsim("run", "--max-requests", "80", "--seed", "4", "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    again = kvsim(
        "run", "--config", str(tmp_path / "a" / "config.toml"), "--out", str(tmp_path / "b")
    )
    assert again.returncode == 0, again.stderr
    a = pq.read_table(tmp_path / "a" / "requests.parquet")
    b = pq.read_table(tmp_path / "b" / "requests.parquet")
    assert a.equals(b)


def test_same_seed_identical_parquet_different_seed_differs(tmp_path):
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        proc = kvsim("run", "--max-requests", "100", "--seed", seed, "--out", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
    read = {n: (tmp_path / n / "requests.parquet").read_bytes() for n in "abc"}
    assert read["a"] == read["b"]
    assert read["a"] != read["c"]


def test_terminal_summary_is_readable(tmp_path):
    proc = kvsim("run", "--max-requests", "50", "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    for label in ("TTFT p50", "TPOT p50", "output throughput", "prefix hit ratio"):
        assert label in proc.stdout


def test_size_reports_known_values():
    proc = kvsim("size", "--model", "llama-3.1-70b", "--tp", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kv_bytes_per_token_per_replica"] == 327_680
    assert report["kv_bytes_per_token_per_rank"] == 40_960
    proc = kvsim(
        "size",
        "--model",
        "deepseek-v3",
        "--tp",
        "8",
        "--hardware",
        "h200-sxm",
        "--weight-dtype",
        "fp8",
    )
    assert proc.returncode == 0, proc.stderr
    assert "56.9" in proc.stdout or "over" in proc.stdout.lower()


BAD = [
    (["run", "--model", "gpt-17"], "unknown model 'gpt-17'"),
    (["run", "--trace", "nope"], "unknown trace 'nope'"),
    (["run", "--policy", "nope"], "unknown policy 'nope'"),
    (["run", "--hardware", "nope"], "unknown profile 'nope'"),
    (["run", "--rate", "-1"], "--rate"),
    (["run", "--max-requests", "0"], "--max-requests"),
    (["run", "--block-size", "0"], "--block-size: expected a positive integer"),
    (["size", "--model", "llama-3.1-405b", "--tp", "0"], "--tp"),
    (["run", "--bogus"], "No such option"),
]


@pytest.mark.parametrize(("args", "needle"), BAD)
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    out = tmp_path / "out"
    proc = kvsim(*args, "--out", str(out)) if args[0] == "run" else kvsim(*args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists()


def test_malformed_trace_row_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 5, "input_length": -3, "output_length": 5, "hash_ids": [2]}\n'
    )
    proc = kvsim("run", "--trace", str(bad), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "bad.jsonl:2" in proc.stderr and "input_length" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_profile_commands(tmp_path):
    assert "h100-sxm" in kvsim("profile", "list").stdout
    assert "hbm" in kvsim("profile", "show", "h200-sxm").stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n")
    proc = kvsim("profile", "validate", str(bad))
    assert proc.returncode == 2 and "bad.toml" in proc.stderr


def test_run_with_tiers_reports_tiers_cost_and_timeline(tmp_path):
    out = tmp_path / "tiers"
    proc = kvsim(
        "run",
        "--trace",
        "mooncake-conversation",
        "--max-requests",
        "200",
        "--tiers",
        "hbm,dram,nvme",
        "--tier",
        "dram=64GiB",
        "--tier",
        "nvme=2TB",
        "--policy",
        "hbm=lru,dram=s3fifo",
        "--num-gpu-blocks",
        "4000",
        "--out",
        str(out),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert set(summary["hit_ratio_by_tier"]) == {"hbm", "dram", "nvme"}
    assert summary["prefix_hit_ratio"] == pytest.approx(sum(summary["hit_ratio_by_tier"].values()))
    assert summary["cost_usd"] > 0 and summary["cost_per_million_tokens_usd"] > 0
    assert summary["tiers"]["dram"]["capacity_blocks"] == 64 * 2**30 // 8 // (16 * 131_072)
    timeline = pq.read_table(out / "timeline.parquet")
    assert {"time_s", "hbm_used_blocks", "dram_blocks", "nvme_link_busy"} <= set(
        timeline.column_names
    )
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["engine"]["tiers"] == "hbm,dram,nvme"


def test_size_with_tiers_counts_every_tier():
    proc = kvsim("size", "--model", "llama-3.1-70b", "--tp", "8", "--tiers", "--json")
    assert proc.returncode == 0, proc.stderr
    tiers = {row["tier"]: row for row in json.loads(proc.stdout)["tiers"]}
    assert list(tiers) == ["hbm", "dram", "cxl", "nvme", "rdma", "pfs"]
    assert tiers["dram"]["kv_tokens_per_node"] == 2 * 10**12 // 327_680


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tiers", "hbm,ssd"], "unknown tier 'ssd'"),
        (["--tier", "dram=lots"], "dram=lots"),
        (["--tier", "hbm=1TB"], "num-gpu-blocks"),
        (["--policy", "hbm=lru,dram=nope"], "unknown policy 'nope'"),
        (["--admission", "dram=sometimes"], "admission"),
    ],
)
def test_bad_tier_options(tmp_path, args, needle):
    proc = kvsim("run", "--max-requests", "5", *args, "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "summary.json").exists()


def test_mrc_and_trace_commands_end_to_end(tmp_path):
    proc = kvsim(
        "mrc",
        "--trace",
        "mooncake-arxiv-1000",
        "--policy",
        "lru,belady",
        "--capacity",
        "100,1000",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    by = {(r["policy"], r["capacity"]): r["hit_ratio"] for r in results}
    assert by[("belady", 100)] >= by[("lru", 100)] and by[("belady", 1000)] >= by[("lru", 1000)]
    bad = kvsim("mrc", "--trace", "mooncake-arxiv-1000", "--policy", "lru", "--capacity", "-5")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    stats = kvsim("trace", "stats", "pi-coding-agent", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["requests"] == 17


def test_policy_parameters_reach_the_policy(tmp_path):
    base = [
        "mrc",
        "--trace",
        "mooncake-arxiv-1000",
        "--policy",
        "ema-head",
        "--capacity",
        "500",
        "--semantics",
        "prefix",
        "--json",
    ]
    lossless = json.loads(kvsim(*base).stdout)["results"][0]
    lossy = json.loads(kvsim(*base, "--policy-param", "ema-head.tolerate_loss=0.001").stdout)
    lossy = lossy["results"][0]
    assert lossy["lossy_hits"] > 0 and lossless["lossy_hits"] == 0
    assert lossy["hit_ratio"] > lossless["hit_ratio"]
    proc = kvsim(
        "run",
        "--max-requests",
        "20",
        "--policy",
        "bayes-reuse",
        "--policy-param",
        "bayes-reuse.nope=1",
        "--out",
        str(tmp_path / "x"),
    )
    assert proc.returncode == 2 and "unknown parameter 'nope'" in proc.stderr
    proc = kvsim(
        "run",
        "--max-requests",
        "30",
        "--policy",
        "bayes-reuse",
        "--policy-param",
        "bayes-reuse.horizon_s=30",
        "--out",
        str(tmp_path / "y"),
    )
    assert proc.returncode == 0, proc.stderr
    config = tomllib.loads((tmp_path / "y" / "config.toml").read_text())
    assert config["engine"]["policy_params"] == "bayes-reuse.horizon_s=30"

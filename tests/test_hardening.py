"""Issue 10, the CLI half: bad values, output paths, honest results folders, runs that complete
nothing, sizing that reports instead of failing, per-replica tier capacity and overload.

CLI behaviour and exit codes run `python -m kvsim` in a subprocess (as a user would); the many
one-line refusals run `kvsim.cli.main` in process, which is the same code path, to keep time low.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import in_process

from kvsim.engine.config import EngineConfig
from kvsim.errors import ConfigError, KvsimError
from kvsim.models import load_model
from kvsim.models.catalog import parse_model
from kvsim.policies import make_policy, parse_policy_params
from kvsim.run import (
    COMPLETE_MARKER,
    ResultsFolder,
    RunConfig,
    format_tiers_per_replica,
    is_complete,
    json_safe,
    run,
    summary_json,
    write_outputs,
)

SMALL = ("--max-requests", "20")


def kvsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvsim", *args], capture_output=True, text=True, timeout=300
    )


def strict_json(text: str) -> object:
    """json.loads that refuses NaN and Infinity (which Python writes but JSON does not have)."""

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in JSON")

    return json.loads(text, parse_constant=refuse)


def one_line_error(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert needle in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def no_partials(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name]


# -- 1. follow-ups from the validation work -------------------------------------------------------
def test_config_not_utf8_is_one_line(tmp_path, capsys):
    bad = tmp_path / "config.toml"
    bad.write_bytes(b'[trace]\nname = "caf\xe9"\n')
    code, _, err = in_process(capsys, "run", "--config", str(bad), "--out", str(tmp_path / "o"))
    one_line_error(code, err, "config.toml:2: not UTF-8")


@pytest.mark.parametrize(("kind", "needle"), [("missing", "no such file"), ("dir", "directory")])
def test_config_missing_or_directory_is_config_error(tmp_path, kind, needle):
    path = tmp_path / "c.toml"
    if kind == "dir":
        path.mkdir()
    with pytest.raises(ConfigError, match=needle):
        RunConfig.from_toml(path)


def test_config_toml_syntax_error_still_one_line(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("[trace\n")
    with pytest.raises(ConfigError, match=r"c\.toml"):
        RunConfig.from_toml(bad)


def test_trace_warnings_reach_summary_and_stderr(tmp_path):
    far = tmp_path / "far.jsonl"
    far.write_text(
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 3000000000, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n'
        "not json\n"
    )
    proc = kvsim("run", "--trace", str(far), "--skip-bad-rows", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "skipped 1 malformed rows" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert any("30 days" in w for w in warnings), proc.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["skipped_rows"] == 1
    assert len(summary["trace_warnings"]) == 1 and "30 days" in summary["trace_warnings"][0]


def test_tier_help_says_a_unit_is_required(capsys):
    code, out, _ = in_process(capsys, "run", "--help")
    assert code == 0
    assert "with its unit" in " ".join(out.split())


# -- 2. bad values ---------------------------------------------------------------------------------
BAD_RUN = [
    (["--seed", "-1"], "--seed: expected a non-negative integer, got -1"),
    (["--policy", ""], "--policy: expected a policy name"),
    (["--policy", "  "], "--policy: expected a policy name"),
    (["--router", ""], "--router: expected a router name"),
    (["--policy", "lru-k", "--policy-param", "lru-k.k=abc"], "parameter k: expected an integer"),
    (["--policy", "lru-k", "--policy-param", "lru-k.k=2.5"], "parameter k: expected an integer"),
    (["--policy", "lru-k", "--policy-param", "lru-k.k=true"], "parameter k: expected an integer"),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.horizon_s=abc"],
        "parameter horizon_s: expected a number, got 'abc'",
    ),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.horizon_s=nan"],
        "parameter horizon_s: expected a finite number",
    ),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.horizon_s=NaN"],
        "parameter horizon_s: expected a finite number",
    ),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.horizon_s=Infinity"],
        "parameter horizon_s: expected a finite number",
    ),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.horizon_s=-inf"],
        "parameter horizon_s: expected a finite number",
    ),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.prefix_aware=1"],
        "parameter prefix_aware: expected true or false",
    ),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.turn_edges=[1,2]"],
        "expected a list of 3 values",
    ),
    # a parameter for a policy the run does not use would silently do nothing
    (["--policy-param", "bayes-reuse.horizon_s=60"], "'bayes-reuse' is not used in this run"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_RUN)
def test_bad_run_values_are_one_line(tmp_path, capsys, args, needle):
    out = tmp_path / "o"
    code, _, err = in_process(capsys, "run", *SMALL, *args, "--out", str(out))
    one_line_error(code, err, needle)
    assert not out.exists()
    no_partials(tmp_path)


def test_bad_values_exit_2_as_a_user_sees_them(tmp_path):
    for args, needle in (BAD_RUN[0], BAD_RUN[9]):
        proc = kvsim("run", *SMALL, *args, "--out", str(tmp_path / "o"))
        one_line_error(proc.returncode, proc.stderr, needle)


BAD_MRC = [
    (["--block-size", "0"], "--block-size: expected a positive number of tokens, got 0"),
    (["--block-size", "-4"], "--block-size: expected a positive number of tokens, got -4"),
    (["--policy", ""], "--policy"),
    (["--policy", "lru-k", "--policy-param", "lru-k.k=abc"], "parameter k: expected an integer"),
    (
        ["--policy", "bayes-reuse", "--policy-param", "bayes-reuse.horizon_s=NaN"],
        "expected a finite number",
    ),
]


@pytest.mark.parametrize(("args", "needle"), BAD_MRC)
def test_bad_mrc_values_are_one_line(capsys, args, needle):
    base = {"--trace": "sharegpt", "--policy": "lru", "--capacity": "100", "--max-requests": "20"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    flat = [x for kv in base.items() for x in kv]
    code, _, err = in_process(capsys, "mrc", *flat)
    one_line_error(code, err, needle)


def test_policy_params_are_typed_against_the_dataclass():
    params = make_policy("bayes-reuse", {"horizon_s": 60, "turn_edges": [1, 2, 3]}).params
    assert params.horizon_s == 60.0 and isinstance(params.horizon_s, float)
    assert params.turn_edges == (1, 2, 3)
    assert make_policy("lru-k", {"k": 3.0}).params.k == 3  # a whole float is an integer
    for bad in ({"horizon_s": math.nan}, {"horizon_s": math.inf}, {"gap_edges": [0.5, math.nan]}):
        with pytest.raises(ConfigError, match="finite"):
            make_policy("bayes-reuse", bad)
    ((name, values),) = parse_policy_params(["s3fifo.small_size_ratio=abc"]).items()
    with pytest.raises(ConfigError, match="small_size_ratio: expected a number"):
        make_policy(name, values)


def test_negative_seed_refused_by_the_python_api_too():
    with pytest.raises(ConfigError, match="seed"):
        run(RunConfig(max_requests=5, engine=EngineConfig(seed=-1)))
    with pytest.raises(ConfigError, match="policy"):
        run(RunConfig(max_requests=5, engine=EngineConfig(policy="")))


# -- 3. output paths checked before simulating ----------------------------------------------------
def test_out_onto_a_file_fails_before_the_trace_is_read(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("mine")
    # the trace does not exist: the output path is refused first, so nothing was simulated
    code, _, err = in_process(
        capsys, "run", "--trace", str(tmp_path / "nope.jsonl"), "--out", str(target)
    )
    one_line_error(code, err, str(target))
    assert "is a file" in err
    assert target.read_text() == "mine"


def test_out_below_a_file_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "run"
    code, _, err = in_process(capsys, "run", *SMALL, "--out", str(out))
    one_line_error(code, err, f"{out}: cannot create the results folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_out_in_a_read_only_folder_is_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, _, err = in_process(capsys, "run", *SMALL, "--out", str(ro / "run"))
        one_line_error(code, err, "cannot create the results folder")
    finally:
        ro.chmod(0o755)


def test_out_in_a_read_only_filesystem_is_one_line(capsys):
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    code, _, err = in_process(capsys, "run", *SMALL, "--out", "/proc/kvsim-out/run")
    one_line_error(code, err, "/proc/kvsim-out/run")


def test_failed_run_leaves_no_folders_behind(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "run"
    code, _, err = in_process(
        capsys, "run", "--trace", str(tmp_path / "nope.jsonl"), "--out", str(out)
    )
    assert code == 2, err
    assert list(tmp_path.iterdir()) == []  # not even the parent folders it made


@pytest.mark.parametrize(
    ("plot", "needle"),
    [
        ("missing/mrc.png", "does not exist"),
        ("mrc.txt", "expected a file ending in .png, .svg, .pdf"),
        ("mrc", "no suffix"),
    ],
)
def test_mrc_plot_path_checked_before_replay(tmp_path, capsys, plot, needle):
    code, _, err = in_process(
        capsys,
        "mrc",
        "--trace",
        "sharegpt",
        "--policy",
        "lru",
        "--capacity",
        "100",
        "--max-requests",
        "20",
        "--plot",
        str(tmp_path / plot),
    )
    one_line_error(code, err, needle)


def test_mrc_plot_writes_svg(tmp_path, capsys):
    plot = tmp_path / "mrc.svg"
    code, _, err = in_process(
        capsys,
        "mrc",
        "--trace",
        "sharegpt",
        "--policy",
        "lru",
        "--capacity",
        "50,100",
        "--max-requests",
        "20",
        "--plot",
        str(plot),
    )
    assert code == 0, err
    assert plot.read_text().lstrip().startswith("<?xml")


def test_trace_outputs_into_a_missing_folder_are_one_line(tmp_path, capsys):
    out = tmp_path / "missing" / "t.parquet"
    code, _, err = in_process(capsys, "trace", "convert", "sharegpt", "-o", str(out))
    one_line_error(code, err, "does not exist")
    code, _, err = in_process(
        capsys, "trace", "synth", "sharegpt", "--requests", "3", "-o", str(out)
    )
    one_line_error(code, err, "does not exist")
    code, _, err = in_process(
        capsys, "trace", "synth", "sharegpt", "--requests", "3", "-o", str(tmp_path)
    )
    one_line_error(code, err, "is a directory")
    taken = tmp_path / "file"
    taken.write_text("x")
    code, _, err = in_process(capsys, "trace", "stats", "sharegpt", "--plot", str(taken / "sub"))
    one_line_error(code, err, "--plot")


# -- 4. results folders ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outcome():
    return run(RunConfig(max_requests=20))


def test_results_folder_is_complete_and_marked(tmp_path, outcome):
    out = write_outputs(outcome, tmp_path / "r")
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [COMPLETE_MARKER, "config.toml", "requests.parquet", "summary.json", "timeline.parquet"]
    )
    assert is_complete(out)
    assert not is_complete(tmp_path)
    no_partials(tmp_path)


def test_an_empty_existing_out_is_used(tmp_path, outcome):
    (tmp_path / "r").mkdir()
    assert is_complete(write_outputs(outcome, tmp_path / "r"))


def test_non_empty_out_needs_overwrite(tmp_path, outcome, capsys):
    out = write_outputs(outcome, tmp_path / "r")
    before = (out / "summary.json").read_text()
    with pytest.raises(ConfigError, match="not empty; pass --overwrite"):
        write_outputs(outcome, out)
    code, _, err = in_process(capsys, "run", *SMALL, "--seed", "3", "--out", str(out))
    one_line_error(code, err, "--overwrite")
    assert (out / "summary.json").read_text() == before
    code, _, err = in_process(
        capsys, "run", *SMALL, "--seed", "3", "--out", str(out), "--overwrite"
    )
    assert code == 0, err
    assert is_complete(out)
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["engine"]["seed"] == 3
    no_partials(tmp_path)


def test_overwrite_refuses_a_folder_kvsim_did_not_write(tmp_path, outcome):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    with pytest.raises(ConfigError, match=r"'thesis\.tex', which is not a kvsim result file"):
        write_outputs(outcome, mine, overwrite=True)
    assert (mine / "thesis.tex").read_text() == "precious"


def test_failed_write_leaves_the_old_results_untouched(tmp_path, outcome, monkeypatch):
    out = write_outputs(outcome, tmp_path / "r")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import kvsim.run as run_module

    real = run_module.pq.write_table
    calls = []

    def fail_second(table, where, *args, **kwargs):
        calls.append(where)
        if len(calls) == 2:  # requests.parquet written, timeline.parquet fails
            raise OSError(28, "No space left on device")
        return real(table, where, *args, **kwargs)

    monkeypatch.setattr(run_module.pq, "write_table", fail_second)
    with pytest.raises(ConfigError, match="cannot write results: No space left"):
        write_outputs(outcome, out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    no_partials(tmp_path)


def test_two_folders_racing_for_one_out(tmp_path, outcome):
    """Both reserved before either finished: the second to finish does not replace the first."""
    first = ResultsFolder(tmp_path / "r")
    second = ResultsFolder(tmp_path / "r")
    other = dataclasses.replace(outcome, summary={**outcome.summary, "marker": "second"})
    first.write(outcome)
    with pytest.raises(ConfigError, match=r"another run wrote its results there.*r-2"):
        second.write(other)
    assert "marker" not in json.loads((tmp_path / "r" / "summary.json").read_text())
    assert json.loads((tmp_path / "r-2" / "summary.json").read_text())["marker"] == "second"
    assert is_complete(tmp_path / "r") and is_complete(tmp_path / "r-2")
    no_partials(tmp_path)


def test_two_concurrent_runs_to_one_out(tmp_path):
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "kvsim", "run", "--max-requests", "100", "--json"]
    procs = [
        subprocess.Popen(
            [*cmd, "--seed", str(seed), "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    (winner,) = [out_text for code, out_text, _ in results if code == 0]
    (loser_err,) = [err for code, _, err in results if code == 2]
    assert str(out) in loser_err and len(loser_err.strip().splitlines()) == 1
    assert strict_json((out / "summary.json").read_text()) == strict_json(winner)
    assert is_complete(out)
    no_partials(tmp_path)


# -- 5. nothing completes --------------------------------------------------------------------------
def test_nothing_completes_says_why_and_exits_2(tmp_path):
    out = tmp_path / "r"
    proc = kvsim("run", *SMALL, "--num-gpu-blocks", "1", "--out", str(out), "--json")
    one_line_error(proc.returncode, proc.stderr, "0 of 20 requests completed: all 20 were refused")
    assert "more KV blocks than a replica has" in proc.stderr and str(out) in proc.stderr
    printed = strict_json(proc.stdout)
    written = strict_json((out / "summary.json").read_text())
    assert printed == written
    assert written["completed"] == 0 and written["ttft_p50_s"] is None
    assert written["cost_per_million_tokens_usd"] is None
    assert is_complete(out)  # the results are still there to inspect
    status = pq.read_table(out / "requests.parquet").column("status").to_pylist()
    assert set(status) == {"rejected"}


def test_nothing_completes_terminal_summary_has_no_nan(tmp_path, capsys):
    code, out, err = in_process(
        capsys, "run", *SMALL, "--num-gpu-blocks", "1", "--out", str(tmp_path / "r")
    )
    assert code == 2 and "refused" in err
    assert "nan" not in out.lower() and "n/a" in out


def test_some_refused_is_a_warning(tmp_path, capsys):
    code, _, err = in_process(
        capsys,
        "run",
        "--max-requests",
        "50",
        "--num-gpu-blocks",
        "30",
        "--out",
        str(tmp_path / "r"),
    )
    assert code == 0, err
    assert err.startswith("warning: ") and "were refused" in err


def test_json_safe_replaces_every_nan():
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": "nan", "e": 2}
    assert json_safe(value) == {"a": None, "b": [1.0, None, {"c": None}], "d": "nan", "e": 2}
    assert strict_json(summary_json(value)) == json_safe(value)


# -- 6. sizing -------------------------------------------------------------------------------------
def test_size_without_tp_reports_sizes_and_a_finding():
    proc = kvsim("size", "--model", "llama-3.1-70b")
    assert proc.returncode == 0, proc.stderr
    assert "KV per token, per rank" in proc.stdout and "320.0 KiB" in proc.stdout
    assert "KV per block, per rank" in proc.stdout and "5.0 MiB" in proc.stdout
    assert "does not fit at tp=1" in proc.stdout and "tp=4 is the smallest" in proc.stdout
    report = json.loads(kvsim("size", "--model", "llama-3.1-70b", "--json").stdout)
    assert report["fits"] is False and report["smallest_tp_that_fits"] == 4
    assert report["kv_bytes_per_token_per_rank"] == 327_680
    assert report["kv_bytes_per_block_per_rank"] == 16 * 327_680
    assert report["kv_blocks"] is None


def test_size_with_tiers_that_does_not_fit_says_why(capsys):
    code, out, err = in_process(capsys, "size", "--model", "llama-3.1-70b", "--tiers")
    assert code == 0, err
    assert "does not fit" in out and "no tier table" in out


def test_catalog_knows_native_weight_dtype():
    assert load_model("deepseek-v3").weight_dtype == "fp8"
    assert load_model("llama-3.1-8b").weight_dtype == "bf16"
    text = Path(__file__).parents[1].joinpath("kvsim/catalog/llama-3.2-1b.toml").read_text()
    with pytest.raises(ConfigError, match="weight_dtype: 'fp9' is not one of"):
        parse_model('weight_dtype = "fp9"\n' + text, "m.toml")


def test_size_defaults_to_the_native_weight_dtype(capsys):
    base = ("size", "--model", "deepseek-v3", "--tp", "8", "--hardware", "h200-sxm", "--json")
    _, out, _ = in_process(capsys, *base)
    native = json.loads(out)
    assert native["weight_dtype"] == "fp8" and native["fits"] is True
    _, out, _ = in_process(capsys, *base, "--weight-dtype", "bf16")
    assert json.loads(out)["fits"] is False


def test_run_resolves_the_native_weight_dtype(tmp_path, capsys):
    engine = EngineConfig(tp=8)
    native = run(RunConfig(model="deepseek-v3", hardware="h200-sxm", max_requests=5, engine=engine))
    assert native.config.weight_dtype == "fp8" and native.config.engine.weight_dtype == "fp8"
    assert native.summary["weight_dtype"] == "fp8"
    with pytest.raises(KvsimError, match="bf16 weights need"):
        run(
            RunConfig(
                model="deepseek-v3",
                hardware="h200-sxm",
                max_requests=5,
                weight_dtype="bf16",
                engine=engine,
            )
        )
    # the CLI option, and the written config reproduces the choice
    out = tmp_path / "r"
    code, _, err = in_process(capsys, "run", *SMALL, "--weight-dtype", "fp8", "--out", str(out))
    assert code == 0, err
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["model"]["weight_dtype"] == "fp8" and config["engine"]["weight_dtype"] == "fp8"
    assert RunConfig.from_toml(out / "config.toml").weight_dtype == "fp8"


def test_bf16_models_are_unchanged_by_the_resolution():
    def figures(config):
        summary = dict(run(config).summary)
        summary.pop("wall_s")
        return summary

    assert figures(RunConfig(max_requests=30)) == figures(
        RunConfig(max_requests=30, weight_dtype="bf16")
    )
    # an engine weight dtype set in code is a choice, not overridden by the native one
    chosen = run(RunConfig(max_requests=5, engine=EngineConfig(weight_dtype="fp8")))
    assert chosen.config.weight_dtype == "fp8"


def test_config_weight_dtypes_must_agree(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nweight_dtype = "fp8"\n[engine]\nweight_dtype = "bf16"\n')
    with pytest.raises(ConfigError, match="disagrees"):
        RunConfig.from_toml(path)
    path.write_text('[engine]\nweight_dtype = "fp8"\n')
    assert RunConfig.from_toml(path).weight_dtype == "fp8"


# -- 7. tier capacity per replica ------------------------------------------------------------------
def test_terminal_summary_shows_each_tiers_share(tmp_path, capsys):
    code, out, err = in_process(
        capsys, "run", *SMALL, "--tier", "dram=512GiB", "--out", str(tmp_path / "r")
    )
    assert code == 0, err
    assert "tiers per replica" in out
    assert "dram 64.0 GiB (1/8 of 512.0 GiB per node)" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    dram = summary["tiers_per_replica"]["dram"]
    assert dram["share"] == 1 / 8 and dram["tier_capacity_bytes"] == 512 * 2**30
    blocks = summary["tiers"]["dram"]["capacity_blocks"]
    assert dram["capacity_bytes"] == blocks * summary["kv_block_bytes_per_rank"]


def test_tier_share_per_replica_in_a_cluster_and_with_tp():
    engine = EngineConfig(replicas=2, tp=2, tier_capacity="dram=512GiB")
    summary = run(RunConfig(max_requests=20, engine=engine)).summary
    dram = summary["tiers_per_replica"]["dram"]
    assert dram["share"] == 2 / 8
    per_replica = summary["tiers"]["dram"]["capacity_blocks"] // 2
    assert dram["capacity_bytes"] == per_replica * summary["kv_block_bytes_per_rank"] * 2
    assert dram["capacity_bytes"] <= 128 * 2**30
    text = format_tiers_per_replica(summary["tiers_per_replica"])
    assert text.startswith("dram ") and "(1/4 of 512.0 GiB per node)" in text


def test_shared_pool_is_described_as_shared():
    tiers = {
        "rdma": {
            "capacity_bytes": 2**40 // 32,
            "tier_capacity_bytes": 2**40,
            "share": 1 / 32,
            "shared_by_nodes": 4,
        }
    }
    assert format_tiers_per_replica(tiers) == (
        "rdma 32.0 GiB (1/32 of a 1.0 TiB pool shared by 4 nodes)"
    )


# -- 8. overload -----------------------------------------------------------------------------------
def test_overload_warns_and_points_to_replicas(tmp_path):
    proc = kvsim(
        "run", "--trace", "mooncake-conversation", "--max-requests", "300",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "offered load" in x]
    assert line.startswith("warning: the offered load exceeds what 1 replica can serve")
    assert "--replicas" in line
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert any("offered load" in w for w in summary["run_warnings"])


def test_a_light_load_does_not_warn(outcome):
    # decode keeps the replica busy, but TTFT stays near one prefill: not overload
    assert outcome.summary["busy_fraction"] > 0.9
    assert outcome.summary["run_warnings"] == []

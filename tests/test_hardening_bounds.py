"""Issue 25: sizes that scale time or memory are bounded or estimated before anything runs.

The sweep grid and `compare --vary` product are refused from the lists' lengths, before the
product is built; plan and sweep resolve every configuration they will run first; a long or large
run is estimated before it starts; a per-layer compression of the wrong length says what the
model needs.
"""

from __future__ import annotations

import time

import pytest

import kvsim.run
from kvsim.cli import main
from kvsim.compare import compare
from kvsim.errors import ConfigError
from kvsim.run import RunConfig
from kvsim.sweep.spec import MAX_CONFIGURATIONS, expand_spec

# -- sweep grid size ---------------------------------------------------------------------------
TEN_KEYS = (
    "seed",
    "max_requests",
    "replicas",
    "block_size",
    "max_num_seqs",
    "num_gpu_blocks",
    "max_num_batched_tokens",
    "num_scheduler_steps",
    "pd_threshold",
    "rate_scale",
)


def test_a_grid_of_ten_keys_by_a_hundred_values_is_refused_in_milliseconds(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a configuration was resolved")

    monkeypatch.setattr("kvsim.sweep.spec.resolve", refuse)
    doc = {
        "base": {"trace": "mooncake-conversation"},
        "grid": {k: list(range(1, 101)) for k in TEN_KEYS},
    }
    start = time.perf_counter()
    with pytest.raises(ConfigError) as exc:
        expand_spec(doc, "spec.toml")
    assert time.perf_counter() - start < 0.5
    message = str(exc.value)
    assert "\n" not in message
    assert "grid.seed 100 × grid.max_requests 100" in message
    assert "1e+20 configurations" in message and f"{MAX_CONFIGURATIONS:,}" in message


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        (11, "grid.seed 1,000 × grid.replicas 11 = 11,000 configurations"),
        (5, "grid.seed 1,000 × grid.replicas 5 × zip 3 = 15,000 configurations"),
        (2, "grid.seed 1,000 × grid.replicas 2 × zip 3 × list 2 = 12,000 configurations"),
    ],
)
def test_grid_zip_and_list_multiply_before_the_limit(monkeypatch, replicas, message):
    def refuse(*args, **kwargs):
        raise AssertionError("a configuration was resolved")

    monkeypatch.setattr("kvsim.sweep.spec.resolve", refuse)
    doc = {
        "base": {"trace": "mooncake-conversation", "max_requests": 10},
        "grid": {"seed": list(range(1000)), "replicas": list(range(1, replicas + 1))},
        "zip": {"rate_scale": [1.0, 2.0, 3.0], "block_size": [16, 32, 64]},
        "list": [{"policy": "lru"}, {"policy": "fifo"}],
    }
    with pytest.raises(ConfigError) as exc:
        expand_spec(doc, "spec.toml")
    assert str(exc.value).startswith(f"spec.toml: {message}; at most 10,000")


def test_the_limit_itself_is_allowed_by_arithmetic():
    from kvsim.sweep.spec import check_grid_size

    assert check_grid_size([("grid.seed", MAX_CONFIGURATIONS)], "spec") == MAX_CONFIGURATIONS
    with pytest.raises(ConfigError, match="10,001 configurations"):
        check_grid_size([("grid.seed", MAX_CONFIGURATIONS + 1)], "spec")


def test_sweep_cli_refuses_a_huge_grid_in_one_line(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    lines = ['[base]\ntrace = "mooncake-conversation"\n[grid]\n']
    lines += [f"{k} = {list(range(1, 101))}\n" for k in TEN_KEYS]
    spec.write_text("".join(lines))
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", str(spec), "--out", str(out), "--quiet"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1e+20 configurations" in err
    assert not (out / "results.parquet").exists()


def test_compare_vary_product_is_refused_before_any_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr("kvsim.compare.run_many", refuse)
    vary = {"seed": list(range(100)), "max_requests": list(range(1, 101)), "tp": [1, 2]}
    with pytest.raises(ConfigError, match=r"vary: seed 100 × max_requests 100 × tp 2 = 20,000"):
        compare(RunConfig(trace="mooncake-conversation"), vary)


# -- checked first: sweep and plan refuse an invalid configuration before running anything ----
@pytest.mark.parametrize(
    ("grid", "fragment"),
    [
        ("tp = [1, 3]", "configuration 2 of 2 (tp=3): llama-3.1-8b: tp=3 does not split"),
        (
            'model = ["llama-3.1-8b", "llama-3.1-405b"]',
            "configuration 2 of 2 (model='llama-3.1-405b'): llama-3.1-405b bf16 weights need",
        ),
    ],
)
def test_sweep_refuses_an_invalid_configuration_up_front(tmp_path, capsys, grid, fragment):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[base]\ntrace = "mooncake-conversation"\nmax_requests = 5\nhardware = "a100-80gb"\n'
        f"[grid]\n{grid}\n"
    )
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", str(spec), "--out", str(out), "--quiet", "-j", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert not out.exists() or not any(out.iterdir())


PLAN = ["plan", "--trace", "mooncake-conversation", "--max-requests", "20", "--rates", "1x",
        "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--executor", "serial"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--tp", "3"], "tp=3 does not split the attention heads evenly"),
        (["--model", "llama-3.1-405b", "--hardware", "a100-80gb"], "weights need 811.7 GB"),
        (["--max-replicas", "1000000"], "kvsim models at most 100,000"),
    ],
)
def test_plan_refuses_an_invalid_configuration_before_any_run(monkeypatch, capsys, extra, fragment):
    def refuse(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(kvsim.run, "run", refuse)
    monkeypatch.setattr("kvsim.plan.runner.serial_runner", refuse, raising=False)
    with pytest.raises(SystemExit) as exit_:
        main([*PLAN, *extra])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "miss the SLOs" not in err, err


def test_plan_checks_the_p_d_splits_it_would_try_before_any_run():
    """Compression is not modelled with P/D: a plan whose base compresses would have reported
    its P/D stage as losing to aggregated serving, after the runs, instead of as invalid."""
    import dataclasses

    from kvsim.engine.config import EngineConfig
    from kvsim.plan import PlanSettings, check_runs, parse_rates, resolve_rates

    base = RunConfig(trace="sharegpt", max_requests=20, engine=EngineConfig(compression="quant"))
    settings = PlanSettings(base, 2.0, 0.1, routers=("round-robin",), max_replicas=8)
    rates = resolve_rates(parse_rates("1x,2x"), 1.0)
    with pytest.raises(ConfigError) as exc:
        check_runs(settings, rates)
    message = str(exc.value)
    assert message.startswith("--rates 2x on ") and "P/D 1:1" in message
    assert "a P/D split the plan tries" in message and "compression with --pd" in message
    check_runs(dataclasses.replace(settings, pd_shares=()), rates)  # without P/D it can run


# -- an estimate of time and memory before a long run -----------------------------------------
GIB = 2**30


def _resolved(**kwargs):
    from kvsim.engine.config import EngineConfig
    from kvsim.resolve import resolve

    engine = kwargs.pop("engine", {})
    return resolve(RunConfig(engine=EngineConfig(**engine), **kwargs))


def test_estimate_matches_the_measured_runs_it_is_made_from():
    from kvsim.estimate import estimate

    hbm = estimate(_resolved(trace="lmsys", max_requests=1_000_000,
                             engine={"replicas": 64, "tiers": "hbm"}))  # fmt: skip
    assert 300 < hbm.wall_s < 500 and 2.5 * GIB < hbm.memory_bytes < 3.5 * GIB  # 386 s, 2.9 GiB
    dram = estimate(_resolved(trace="lmsys", max_requests=1_000_000, engine={"replicas": 64}))
    assert 600 < dram.wall_s < 900 and 4 * GIB < dram.memory_bytes < 6 * GIB  # 702 s, 4.13 GiB
    small = estimate(_resolved(trace="mooncake-conversation"))  # 2.9-3.3 s, 251-258 MiB
    assert small.wall_s < 10 and small.memory_bytes < 400 * 2**20
    engine = {"replicas": 64, "tiers": "hbm", "policy": "bayes-reuse"}
    slow = estimate(_resolved(trace="lmsys", max_requests=1_000_000, engine=engine))
    assert slow.wall_s == pytest.approx(8 * hbm.wall_s, rel=0.01)


def test_a_small_run_is_silent_and_a_long_one_warns():
    from kvsim.estimate import check_estimate

    lines: list[str] = []
    machine = (64 * GIB, 32 * GIB)
    check_estimate(_resolved(trace="mooncake-conversation"), False, lines.append, machine)
    assert lines == []
    long = _resolved(trace="lmsys", max_requests=2_000_000, engine={"replicas": 64})
    est = check_estimate(long, False, lines.append, machine)
    assert est.wall_s > 600 and len(lines) == 1
    assert lines[0].startswith("this run is estimated at about ") and "min" in lines[0]
    assert "2,000,000 requests, 64 replicas" in lines[0] and "\n" not in lines[0]


def test_a_run_larger_than_the_machine_is_refused_unless_yes():
    from kvsim.estimate import check_estimate

    big = _resolved(trace="lmsys", max_requests=100_000_000, engine={"replicas": 64})
    lines: list[str] = []
    machine = (16 * GIB, 8 * GIB)
    with pytest.raises(ConfigError) as exc:
        check_estimate(big, False, lines.append, machine)
    message = str(exc.value)
    assert "\n" not in message and "more memory than the 8.0 GiB" in message
    assert "100,000,000 requests" in message and "--yes" in message and lines == []
    check_estimate(big, True, lines.append, machine)  # --yes: a warning, then it runs
    assert len(lines) == 1 and "GiB" in lines[0]
    check_estimate(big, False, lines.append, (None, None))  # memory unknown: only time warns
    assert len(lines) == 2


def test_kvsim_run_refuses_before_writing_and_yes_goes_on(monkeypatch, tmp_path, capsys):
    import kvsim.estimate

    monkeypatch.setattr(kvsim.estimate, "machine_memory", lambda: (4 * GIB, 2 * GIB))

    class Started(Exception):
        pass

    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(kvsim.run, "run_resolved", started)
    out = tmp_path / "out"
    args = ["run", "--trace", "lmsys", "--max-requests", "10000000", "--out", str(out)]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "this machine has available" in err
    assert not out.exists()
    with pytest.raises(Started):
        main([*args, "--yes"])
    assert "warning: this run is estimated at about" in capsys.readouterr().err


# -- a per-layer compression of the wrong length says what the model needs -------------------
@pytest.mark.parametrize(
    "label",
    ["moe-nd:budget=0.5", "moe-nd:layers=0.5x4x2*16/1.0x16x16*16", "moe-nd:layers=0.5x4x2*81"],
)
def test_size_moe_nd_of_the_wrong_length_says_what_the_model_expects(capsys, label):
    """llama-3.1-70b has 80 KV layers; budget= used to report 'lists 32 layers' though nothing
    was listed (the solver's synthetic table has n_layers=32 unless told)."""
    with pytest.raises(SystemExit) as exit_:
        main(["size", "--model", "llama-3.1-70b", "--compression", label])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "llama-3.1-70b has 80 KV layers" in err and "give 80 experts" in err
    assert "a single one for all layers (layers=0.5x4x2)" in err and "n_layers=80" in err


def test_the_hint_it_gives_works(capsys):
    for label in ("moe-nd:budget=0.5,n_layers=80", "moe-nd:layers=0.5x4x2"):
        main(["size", "--model", "llama-3.1-70b", "--tp", "4", "--compression", label])
        assert "compression ratio" in capsys.readouterr().out


def test_other_per_layer_lists_say_how_many_entries():
    from kvsim.compression import compressed_kv_bytes, parse_compression
    from kvsim.models import load_model

    with pytest.raises(ConfigError) as exc:
        compressed_kv_bytes(load_model("llama-3.1-70b"), parse_compression("lkv:ratio=0.1/0.2"), 9)
    assert str(exc.value) == (
        "compression lkv: 2 per-layer entries, but llama-3.1-70b has 80 KV layers (layers that "
        "store KV); give 80 entries, one per KV layer, or a single entry for all layers"
    )

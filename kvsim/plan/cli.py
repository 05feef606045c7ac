"""`kvsim plan`: the click layer over kvsim.plan (everything it does, a notebook can call)."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path

import click

from kvsim.atomic import AtomicFolder
from kvsim.errors import ConfigError, KvsimError
from kvsim.shard.options import warmup_option

EXECUTORS = ("serial", "local", "ray")


class PlanFolder(AtomicFolder):
    """--out: a new or empty folder, reserved now (an unwritable place fails before any run) and
    filled whole at the end: plan.json and the figures appear together or not at all."""

    what = "the plan's folder"

    def check_target(self) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out}: is a file, not a folder")
        if self.entries():
            raise ConfigError(f"--out {out}: folder is not empty; choose a new or empty one")


@click.command()
@click.option("--trace", required=True, help="Built-in trace name or trace file.")
@click.option("--model", default="llama-3.1-8b", show_default=True, help="Catalog model or TOML.")
@click.option("--hardware", default="h100-sxm", show_default=True, help="Hardware profile.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel GPUs/replica.")
@click.option(
    "--engine",
    default="vllm",
    show_default=True,
    help="Serving engine profile NAME[@VERSION] (kvsim engine list).",
)
@click.option("--slo-ttft-p99", type=float, required=True, help="TTFT p99 objective, seconds.")
@click.option("--slo-tpot-p99", type=float, required=True, help="TPOT p99 objective, seconds.")
@click.option(
    "--rates",
    required=True,
    help="Offered loads, comma-separated: multiples of the trace's arrival rate (2x, as "
    "--rate-scale) or requests per second (5/s), e.g. 1x,2x,4x.",
)
@click.option(
    "--routers",
    help="Routers to try, comma-separated. [default: round-robin,dynamo-kv,llm-d]",
)
@click.option("--max-requests", type=int, help="Plan on the trace's first N requests.")
@click.option(
    "--max-replicas",
    type=int,
    default=64,
    show_default=True,
    help="Largest fleet tried; a rate that needs more is reported as unmet.",
)
@click.option(
    "--min-gain",
    type=float,
    default=0.01,
    show_default=True,
    help="A larger tier must cut $/M tokens by at least this fraction to be kept.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every run.")
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    help="serial: one run after another here; local: a process pool (-j); ray: a Ray cluster "
    "(--ray-address, or a local Ray). [default: local when kvsim.sweep is installed, else serial]",
)
@click.option("-j", "--jobs", type=int, help="Parallel runs (local, ray). [default: CPU count]")
@click.option("--ray-address", help="Join this Ray cluster (with --executor ray).")
@click.option(
    "--shards",
    type=int,
    help="Time-shard every run into this many windows (kvsim run --shards; an approximation, "
    "docs/sharding.md); runs that cannot be split run whole. [default: 1, unsharded]",
)
@warmup_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Folder (new or empty) for plan.json, cost_vs_rate.png and ttft_pareto.png.",
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
def plan(
    trace: str,
    model: str,
    hardware: str,
    tp: int,
    engine: str,
    slo_ttft_p99: float,
    slo_tpot_p99: float,
    rates: str,
    routers: str | None,
    max_requests: int | None,
    max_replicas: int,
    min_gain: float,
    seed: int,
    executor: str | None,
    jobs: int | None,
    ray_address: str | None,
    shards: int | None,
    warmup_s: float,
    as_json: bool,
    out: str | None,
    quiet: bool,
) -> None:
    """The cheapest deployment ($/M tokens) meeting TTFT and TPOT p99 objectives at each rate.

    Searches replicas (gallop, then bisect), tier sizes (dram, cxl, nvme, the rdma pool: coarse
    to fine), routers and P/D splits; prints the frontier, one line per rate on why its winner
    won, and the number of runs. Everything is checked before the first run.
    """
    from kvsim.engine.config import EngineConfig
    from kvsim.hardware import load_profile
    from kvsim.models import load_model
    from kvsim.plan import (
        DEFAULT_ROUTERS,
        PlanSettings,
        check_runs,
        check_settings,
        format_frontier,
        parse_rates,
        plan_json,
        resolve_rates,
        trace_rate_per_s,
        write_plots,
    )
    from kvsim.plan.runner import sweep_available
    from kvsim.run import RunConfig
    from kvsim.traces import load_trace

    specs = parse_rates(rates)
    for name, value in (("slo-ttft-p99", slo_ttft_p99), ("slo-tpot-p99", slo_tpot_p99)):
        if not (math.isfinite(value) and value > 0):
            raise KvsimError(f"--{name}: expected a positive number of seconds, got {value}")
    for name, value in (("max-requests", max_requests), ("jobs", jobs), ("tp", tp)):
        if value is not None and value < 1:
            raise KvsimError(f"--{name}: expected a positive integer, got {value}")
    if seed < 0:
        raise KvsimError(f"--seed: expected a non-negative integer, got {seed}")
    executor = executor or ("local" if sweep_available() else "serial")
    if executor != "serial" and not sweep_available():
        raise KvsimError(f"--executor {executor}: needs kvsim.sweep, which this build lacks")
    if ray_address is not None and executor != "ray":
        raise KvsimError("--ray-address: only with --executor ray")
    if executor == "serial" and jobs not in (None, 1):
        raise KvsimError("-j: --executor serial runs one at a time; use --executor local")
    sharding = None
    if shards is not None:
        from kvsim.shard.run import Sharding
        from kvsim.shard.windows import check_sharding

        check_sharding(shards, warmup_s)
        if executor == "serial":  # windows run in this process, one after another
            executor, jobs = "local", 1
        sharding = Sharding(shards, warmup_s)
    names = tuple(r.strip() for r in routers.split(",")) if routers is not None else None
    base = RunConfig(
        trace=trace,
        max_requests=max_requests,
        model=model,
        hardware=hardware,
        engine=EngineConfig(tp=tp, seed=seed, engine=engine),
    )
    settings = PlanSettings(
        base,
        slo_ttft_p99,
        slo_tpot_p99,
        routers=names if names is not None else DEFAULT_ROUTERS,
        max_replicas=max_replicas,
        min_gain=min_gain,
    )
    check_settings(settings)
    load_model(model)
    load_profile(hardware)
    loaded = load_trace(trace, max_requests=max_requests, seed=seed)
    try:
        base_per_s = trace_rate_per_s(loaded)
    except ConfigError:
        if any(s.per_s for s in specs):
            raise
        base_per_s = math.nan  # multiples still work; requests/s is unknown
    resolved = resolve_rates(specs, base_per_s)
    check_runs(settings, resolved)
    del loaded
    folder = PlanFolder(out) if out else None
    try:
        result = _search(settings, resolved, executor, jobs, ray_address, quiet, sharding)
    except BaseException:
        if folder is not None:
            folder.discard()
        raise
    if folder is not None:

        def fill(tmp: Path) -> None:
            (tmp / "plan.json").write_text(plan_json(result, indent=2) + "\n")
            write_plots(result, tmp)

        folder.fill(fill, "cannot write the plan")
    click.echo(plan_json(result) if as_json else format_frontier(result))
    if folder is not None and not as_json:
        click.echo(f"plan.json, cost_vs_rate.png and ttft_pareto.png in {folder.out}")


def _search(settings, resolved, executor: str, jobs, ray_address, quiet: bool, sharding=None):
    """Run the plan's search on the chosen executor, with progress lines on a terminal."""
    from kvsim.plan import run_plan
    from kvsim.plan.runner import ShardedRunner, SweepRunner, serial_runner

    start = time.perf_counter()
    show = not quiet and sys.stderr.isatty()

    def on_round(new: int, total: int) -> None:
        if show:
            click.echo(
                f"plan: {new} runs this round, {total} so far, "
                f"{time.perf_counter() - start:,.0f} s",
                err=True,
            )

    if sharding is not None:
        runner_cm = ShardedRunner(sharding, executor, jobs=jobs, ray_address=ray_address)
    elif executor == "serial":
        runner_cm = contextlib.nullcontext(serial_runner)
    else:
        runner_cm = SweepRunner(executor, jobs=jobs, ray_address=ray_address)
    with runner_cm as runner:
        return run_plan(settings, resolved, runner, on_round=on_round)

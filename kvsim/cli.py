"""The `kvsim` command: a thin click layer over the Python API.

User errors (kvsim.errors.KvsimError and click's usage errors) print one line and exit 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from kvsim.errors import ConfigError, KvsimError
from kvsim.shard.options import warmup_option


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvsim")
def cli() -> None:
    """kvsim: simulate KV-cache management in LLM serving."""


# -- kvsim run -------------------------------------------------------------------------------------
_WEIGHT_DTYPES = ["bf16", "fp16", "fp8", "int8", "int4", "fp32"]


def _positive(name: str, value: float | None) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise KvsimError(f"--{name}: expected a positive number, got {value}")


class _Progress:
    """A progress bar on stderr that appears only once a run has taken a couple of seconds."""

    def __init__(self, unit: str = "requests") -> None:
        self.unit = unit
        self.start = time.perf_counter()
        self.last = 0.0
        self.shown = False
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.start < 2.0 or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        self.shown = True
        width = 30
        filled = int(width * done / max(total, 1))
        bar = "#" * filled + "-" * (width - filled)
        sys.stderr.write(f"\r[{bar}] {done}/{total} {self.unit}  {now - self.start:5.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def _format_summary(summary: dict[str, object], out: Path) -> str:
    from kvsim.run import format_tiers_per_replica

    s = summary

    def ms(key: str) -> str:
        v = s[key]
        return "n/a" if not isinstance(v, float) or math.isnan(v) else f"{v * 1000:,.1f} ms"

    def sec(key: str) -> str:
        v = s[key]
        return "n/a" if not isinstance(v, float) or math.isnan(v) else f"{v:.2f} s"

    per_m = s["cost_per_million_tokens_usd"]
    per_m = f"${per_m:.3f}" if isinstance(per_m, float) and math.isfinite(per_m) else "n/a"
    rows = [
        (
            "workload",
            f"{s['trace']}  ({s['requests']} requests, {s['completed']} completed"
            + (f", {s['rejected']} rejected" if s["rejected"] else "")
            + (f", skipped {s['skipped_rows']:,} malformed rows" if s.get("skipped_rows") else "")
            + ")",
        ),
        (
            "model / hardware",
            f"{s['model']} ({s.get('weight_dtype', 'bf16')} weights) on {s['hardware']}, "
            f"policy {s['policy']}",
        ),
        ("engine", _format_engine(s)),
        ("TTFT p50 / p90 / p99", f"{ms('ttft_p50_s')} / {ms('ttft_p90_s')} / {ms('ttft_p99_s')}"),
        ("TPOT p50 / p99", f"{ms('tpot_p50_s')} / {ms('tpot_p99_s')}"),
        ("E2E p50 / p99", f"{sec('e2e_p50_s')} / {sec('e2e_p99_s')}"),
        ("output throughput", f"{s['throughput_tokens_per_s']:,.0f} tok/s"),
        ("total throughput", f"{s['total_throughput_tokens_per_s']:,.0f} tok/s"),
        (
            "prefix hit ratio",
            f"{s['prefix_hit_ratio']:.3f}  ("
            + ", ".join(f"{tier} {ratio:.3f}" for tier, ratio in s["hit_ratio_by_tier"].items())
            + f" of {s['input_tokens']:,} input tokens)",
        ),
        (
            "KV blocks",
            f"{s['kv_blocks']:,}  ({s['evicted_blocks']:,} evictions, "
            f"{s['preemptions']} preemptions)",
        ),
        ("cost", f"${s['cost_usd']:,.2f}  ({per_m} per M tokens)"),
    ]
    if "compression" in s:
        from kvsim.run import format_quality
        from kvsim.units import format_bytes

        rows.append(
            (
                "KV compression",
                f"{s['compression']}: {format_bytes(s['kv_bytes_per_request_mean'])} per "
                f"request (peak {format_bytes(s['kv_bytes_per_request_peak'])}), "
                f"{format_bytes(s['peak_hbm_kv_bytes'])} in HBM at peak",
            )
        )
        rows.append(("quality proxy", format_quality(s)))
    if s.get("tiers_per_replica"):
        rows.append(("tiers per replica", format_tiers_per_replica(s["tiers_per_replica"])))
    if s.get("slo_attainment") is not None:
        slo = s["slo"]
        bounds = ", ".join(
            f"{name} <= {slo[key] * 1000:,.0f} ms"
            for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"))
            if slo[key] is not None
        )
        rows.append(
            (
                "SLO attainment",
                f"{s['slo_attainment']:.3f}  ({bounds}; goodput "
                f"{s['goodput_tokens_per_s']:,.0f} tok/s)",
            )
        )
    attribution = s.get("hit_attribution")
    if attribution:
        rows.append(
            (
                "reuse ceiling split",
                f"{attribution['ceiling']:.3f} = captured {attribution['captured']:.3f}"
                f" + routing {attribution['lost_to_routing']:.3f}"
                f" + eviction {attribution['lost_to_eviction']:.3f}"
                f" + staleness {attribution['lost_to_staleness']:.3f}",
            )
        )
    if "per_replica" in s:
        rows.append(("replicas / router", f"{s['replicas']} behind {s['router']}"))
        if "pd" in s:
            pd = s["pd"]
            rows.append(
                (
                    "prefill / decode",
                    f"{pd['prefill_replicas']}:{pd['decode_replicas']}, "
                    f"{pd['disaggregated']} disaggregated, {pd['local_prefills']} prefilled "
                    f"locally, {pd['kv_transfer_bytes'] / 1e9:,.2f} GB of KV moved",
                )
            )
    if s.get("sharding"):
        walls = s["shard_wall_s"]
        rows.append(
            (
                "sharding",
                f"{s['shards']} windows, {s['warmup_s']:g} s timed warm-up each, slowest "
                f"{max(walls):.2f} s: an approximation (docs/sharding.md)",
            )
        )
    rows += [
        ("simulated / wall", f"{s['simulated_s']:,.1f} s simulated in {s['wall_s']:.2f} s"),
        ("results", str(out)),
    ]
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    if "per_replica" in s:
        text += "\n\n" + _format_replicas(s["per_replica"])  # type: ignore[arg-type]
    return text


def _format_engine(s: dict[str, object]) -> str:
    """The engine profile and where one decode step's time goes (batch 1, 1k context)."""
    text = f"{s.get('engine', '')} (kernel terms: {s.get('kernel_terms', '')})"
    breakdown = s.get("iteration_breakdown_ms") or {}
    if not isinstance(breakdown, dict) or not breakdown:
        return text
    label, parts = next(iter(breakdown.items()))
    shown = ", ".join(
        f"{name.split(' (')[0]} {ms:.1f}"
        for name, ms in parts.items()
        if name != "iteration" and ms >= 0.05
    )
    return f"{text}\n{'':22}{label}: {parts['iteration']:.1f} ms = {shown}"


def _format_replicas(per_replica: list[dict[str, object]]) -> str:
    """One line per replica: where it is, what it served, how fast, how busy."""

    def ms(v: object) -> str:
        return "n/a" if not isinstance(v, float) or math.isnan(v) else f"{v * 1000:,.0f}"

    head = f"{'replica':>7} {'role':>7} {'node':>4} {'requests':>8} {'TTFT p50 ms':>11} "
    head += f"{'TTFT p99 ms':>11} {'hit ratio':>9} {'busy':>5} {'preempt':>7}"
    lines = [head]
    for r in per_replica:
        lines.append(
            f"{r['replica']:>7} {r['role']:>7} {r['node']:>4} {r['requests']:>8} "
            f"{ms(r['ttft_p50_s']):>11} {ms(r['ttft_p99_s']):>11} "
            f"{r['prefix_hit_ratio']:>9.3f} {r['busy_fraction']:>5.2f} {r['preemptions']:>7}"
        )
    return "\n".join(lines)


def _format_baseline(summary: dict[str, object], base: dict[str, object], base_dir: Path) -> str:
    """The run beside its baseline policy: each compared figure and their ratio."""
    from kvsim.compare import FIGURES, figures, ratio

    mine, theirs = figures(summary), figures(base)
    name, other = str(summary["policy"]), str(base["policy"])
    head = ("", name, other, f"{name} / {other}")
    rows = [head]
    for key in [k for k in mine if k in theirs] + [k for k in theirs if k not in mine]:
        if mine.get(key) is None and theirs.get(key) is None:
            continue
        hit = key.startswith("hit_ratio.") or key == "prefix_hit_ratio"
        label = f"hit ratio {key.split('.')[1]}" if key.startswith("hit_ratio.") else None
        label = label or FIGURES[key][0]
        scale = 1.0 if hit else FIGURES[key][1]

        def show(v: float | None, hit: bool = hit, scale: float = scale) -> str:
            if v is None:
                return "n/a"
            return f"{v:.3f}" if hit else f"{v * scale:,.4g}"

        rel = ratio(mine.get(key), theirs.get(key))
        rows.append((label, show(mine.get(key)), show(theirs.get(key)),
                     "n/a" if rel is None else f"{rel:.3f}"))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        f"{r[0]:<{widths[0]}}  "
        + "  ".join(f"{c:>{w}}" for c, w in zip(r[1:], widths[1:], strict=True))
        for r in rows
    ]
    return "\n".join(lines) + f"\nbaseline results  {base_dir}"


def _baseline_json(summary: dict[str, object], base: dict[str, object]) -> str:
    """--json with --baseline: both summaries and the ratio of each compared figure."""
    from kvsim.compare import figures, ratio
    from kvsim.run import json_safe

    mine, theirs = figures(summary), figures(base)
    ratios = {k: ratio(mine.get(k), theirs.get(k)) for k in {**mine, **theirs}}
    doc = {"run": summary, "baseline": base, "ratios": ratios}
    return json.dumps(json_safe(doc), allow_nan=False)


def _default_out() -> Path:
    base = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def _check_ray() -> None:
    """Ray must be importable before `--executor ray` starts anything."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise KvsimError(
            "--executor ray needs Ray, which is not installed: pip install 'kvsim[ray]'"
        ) from None


@cli.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Start from a config.toml (e.g. one a previous run wrote).",
)
@click.option("--trace", help="Built-in trace name or path to a trace file. [default: sharegpt]")
@click.option(
    "--policy",
    help="Eviction policy (name or module:Class) for every tier, or per tier: "
    "hbm=lru,dram=arc. [default: lru]",
)
@click.option(
    "--policy-param",
    "policy_params",
    multiple=True,
    metavar="POLICY.NAME=VALUE",
    help="A policy parameter, e.g. bayes-reuse.horizon_s=60 (repeatable).",
)
@click.option("--model", help="Catalog model name or model TOML. [default: llama-3.1-8b]")
@click.option("--hardware", help="Hardware profile name or TOML. [default: h100-sxm]")
@click.option("--tp", type=int, help="Tensor-parallel GPUs per replica. [default: 1]")
@click.option("--kv-dtype", type=click.Choice(["bf16", "fp16", "fp8", "int8", "int4"]))
@click.option(
    "--weight-dtype",
    type=click.Choice(_WEIGHT_DTYPES),
    help="Weight dtype. [default: the model's native one: fp8 for deepseek-v3, else bf16]",
)
@click.option(
    "--compression",
    help="KV compression NAME[:k=v,...]: none, quant:k=4,v=4, streaming, h2o:budget=0.2, "
    "snapkv, lkv, kvp, moe-nd:budget=0.3, infinigen:budget=0.2, or auto. [default: none]",
)
@click.option(
    "--auto-latency-budget",
    "auto_latency_budget_s",
    type=float,
    help="auto: decode step a request's choice may cost, seconds. [default: 0.05]",
)
@click.option(
    "--auto-memory-fraction",
    type=float,
    help="auto: share of a replica's KV memory one request may hold. [default: 0.05]",
)
@click.option("--block-size", type=int, help="Tokens per KV block. [default: 16]")
@click.option(
    "--engine",
    metavar="NAME[@VERSION]",
    help="Serving engine profile: vllm, sglang, trtllm (current versions), an older one such as "
    "vllm@0.6, or a .toml file (`kvsim engine list`). [default: vllm]",
)
@click.option("--max-num-seqs", type=int, help="Sequences per iteration. [default: the engine's]")
@click.option(
    "--max-batched-tokens",
    type=int,
    help="Token budget per iteration. [default: the engine's]",
)
@click.option("--num-gpu-blocks", type=int, help="Override the KV blocks derived from HBM.")
@click.option("--no-prefix-caching", is_flag=True, default=None, help="Disable prefix reuse.")
@click.option("--max-requests", type=int, help="Replay only the first N requests.")
@click.option("--rate", type=float, help="Session arrival rate (per s) for synthetic traces.")
@click.option("--rate-scale", type=float, help="Multiply the arrival rate (divide timestamps).")
@click.option("--arrival", help="Arrival model: replay, poisson, gamma, servegen[:GROUP/CHUNK].")
@click.option("--cv", type=float, help="Inter-arrival coefficient of variation (gamma).")
@click.option("--format", "trace_format", help="Trace file format when a path is given.")
@click.option("--tokenizer", type=click.Path(dir_okay=False), help="tokenizer.json for text.")
@click.option("--skip-bad-rows", is_flag=True, default=None, help="Skip malformed trace rows.")
@click.option("--tiers", help="Memory tiers to use, e.g. hbm,dram,nvme or all. [profile's]")
@click.option(
    "--tier",
    "tier_capacity",
    multiple=True,
    metavar="NAME=SIZE",
    help="Per-node capacity of a tier with its unit, e.g. dram=1TiB or nvme=8TB (repeatable); "
    "each replica gets its GPUs' share of it.",
)
@click.option("--write-policy", type=click.Choice(["write-back", "write-through"]))
@click.option("--hierarchy", type=click.Choice(["inclusive", "exclusive"]))
@click.option(
    "--load-overlap",
    type=click.Choice(["none", "layerwise", "bidirectional"]),
    help="How a load from a lower tier overlaps compute: none (load, then prefill), layerwise "
    "(CachedAttention) or bidirectional (Cake). [default: none]",
)
@click.option("--admission", help="Lower-tier admission: all, second-chance, or nvme=... pairs.")
@click.option(
    "--chunked-prefill/--no-chunked-prefill",
    default=None,
    help="Split prompts across iterations (vLLM V1); off: a prompt waits until it fits whole "
    "(TensorRT-LLM's default). [default: the engine's]",
)
@click.option(
    "--mixed-batches/--no-mixed-batches",
    default=None,
    help="Prefill chunks and decodes share an iteration (vLLM, TensorRT-LLM); off: an "
    "iteration is all prefill or all decode, prefill first (SGLang). [default: the engine's]",
)
@click.option(
    "--num-scheduler-steps",
    type=int,
    help="Decode steps per scheduler call (vLLM v0 multi-step); arrivals wait for the round. "
    "[default: the engine's]",
)
@click.option(
    "--kv-reservation",
    type=click.Choice(["prompt", "full"]),
    help="KV a request needs free to start: prompt (vLLM, SGLang; preempt on growth) or full "
    "(prompt + output: TensorRT-LLM's GUARANTEED_NO_EVICT). [default: the engine's]",
)
@click.option("--prefetch/--no-prefetch", default=None, help="Prefetch during think time.")
@click.option(
    "--rope-reuse/--no-rope-reuse",
    default=None,
    help="Reuse document/tool KV at new positions by re-rotating keys.",
)
@click.option(
    "--timeline-interval",
    "timeline_interval_s",
    type=float,
    help="Simulated seconds between timeline samples. [default: 1]",
)
@click.option("--replicas", type=int, help="Serving replicas of --tp GPUs each. [default: 1]")
@click.option(
    "--router", help="Router name or module:Class (see kvsim.routers). [default: round-robin]"
)
@click.option(
    "--router-param",
    "router_params",
    multiple=True,
    metavar="ROUTER.NAME=VALUE",
    help="A router parameter, e.g. dynamo-kv.overlap_score_weight=2 (repeatable).",
)
@click.option(
    "--router-refresh-s",
    type=float,
    help="Seconds between the snapshots routers see; 0 = exact live state. [default: 0]",
)
@click.option("--pd", help="Prefill/decode disaggregation P:D, e.g. 1:3.")
@click.option(
    "--pd-threshold",
    type=int,
    help="Prefill on the decode replica below this many uncached tokens. [router's rule or 0]",
)
@click.option("--slo-ttft", "slo_ttft_s", type=float, help="TTFT objective in seconds.")
@click.option("--slo-tpot", "slo_tpot_s", type=float, help="TPOT objective in seconds.")
@click.option("--seed", type=int, help="Seed for every random draw. [default: 0]")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Results folder; must be new or empty. [runs/<time>]",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the results already in --out, and OUT-baseline with --baseline "
    "(kvsim's files only).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option(
    "--baseline",
    "baseline_policy",
    help="Also run this policy on the same config and print the ratios (results in OUT-baseline).",
)
@click.option(
    "--yes",
    is_flag=True,
    help="Run even when the estimate (kvsim.estimate) says it needs more memory than this "
    "machine has available.",
)
@click.option(
    "--shards",
    type=int,
    help="Split the trace into this many consecutive time windows simulated in parallel, each "
    "after a cache-only replay of what came before (an approximation; docs/sharding.md). "
    "[default: 1, unsharded]",
)
@warmup_option
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="With --shards: local processes, or Ray.",
)
@click.option("--ray-address", help="With --executor ray: join this Ray cluster.")
@click.option(
    "-j", "--jobs", type=int, help="With --shards: workers. [default: one per shard, per CPU]"
)
def run(
    config_path: str | None,
    out: str | None,
    overwrite: bool,
    as_json: bool,
    baseline_policy: str | None,
    yes: bool,
    shards: int | None,
    warmup_s: float,
    executor: str,
    ray_address: str | None,
    jobs: int | None,
    **options,
) -> None:
    """Simulate serving replicas on a trace and report TTFT, TPOT, throughput and hit ratio.

    Warnings (trace plausibility, refused requests, overload) go to stderr. A run in which no
    request completes writes its results, says why on stderr and exits 2.
    """
    from kvsim.config import RunConfig
    from kvsim.run import ResultsFolder, nothing_completed, run_resolved, summary_json

    if options.pop("no_prefix_caching"):
        options["enable_prefix_caching"] = False
    options["tier_capacity"] = ",".join(options["tier_capacity"]) or None
    options["policy_params"] = ",".join(options["policy_params"]) or None
    options["router_params"] = ",".join(options["router_params"]) or None
    options["max_num_batched_tokens"] = options.pop("max_batched_tokens")
    given = {k: v for k, v in options.items() if v is not None}
    base = RunConfig.from_toml(config_path) if config_path else RunConfig()
    # the weight dtype is the run's choice (None: the model's native one), not the engine's
    engine_keys = {f.name for f in dataclasses.fields(base.engine)} - {"weight_dtype"}
    engine = dataclasses.replace(
        base.engine, **{k: v for k, v in given.items() if k in engine_keys}
    )
    config = dataclasses.replace(
        base, engine=engine, **{k: v for k, v in given.items() if k not in engine_keys}
    )
    resolved = _resolve_as_typed(config, set(given), config_path)
    base_resolved = None
    if baseline_policy is not None:
        base_engine = dataclasses.replace(config.engine, policy=baseline_policy)
        base_resolved = _resolve_as_typed(
            dataclasses.replace(config, engine=base_engine), {*given, "policy"}, config_path
        )
    sharding = None
    if shards is not None:
        from kvsim.shard.run import Sharding, check_shardable

        if ray_address is not None and executor != "ray":
            raise KvsimError("--ray-address: only with --executor ray")
        sharding = Sharding(shards, warmup_s, executor, ray_address, jobs)
        check_shardable(resolved, sharding)
        if executor == "ray":
            _check_ray()
    elif executor != "local" or ray_address is not None or jobs is not None:
        raise KvsimError("--executor, --ray-address and --jobs: only with --shards")
    # a long or large run says so (or is refused) before anything is written or simulated
    from kvsim.estimate import check_estimate

    check_estimate(resolved, yes, lambda line: click.echo(f"warning: {line}", err=True))
    # fail before simulating when the results cannot be written there
    folder = ResultsFolder(Path(out) if out else _default_out(), overwrite)
    base_folder = None
    if base_resolved is not None:
        try:
            base_out = folder.out.with_name(folder.out.name + "-baseline")
            base_folder = ResultsFolder(base_out, overwrite)
        except BaseException:
            folder.discard()
            raise
    progress = _Progress("windows" if sharding is not None and sharding.shards > 1 else "requests")
    try:
        if sharding is None:
            outcome = run_resolved(resolved, progress=progress)
            base_outcome = run_resolved(base_resolved) if base_resolved is not None else None
        else:
            from kvsim.shard.run import run_resolved_split

            outcome = run_resolved_split(resolved, sharding, progress)
            base_outcome = (
                run_resolved_split(base_resolved, sharding) if base_resolved is not None else None
            )
    except BaseException:
        folder.discard()
        if base_folder is not None:
            base_folder.discard()
        raise
    finally:
        progress.close()
    out_dir = folder.write(outcome)
    summary = outcome.summary
    failed = nothing_completed(summary)
    if base_outcome is not None:
        assert base_folder is not None
        base_dir = base_folder.write(base_outcome)
        if as_json:
            click.echo(_baseline_json(summary, base_outcome.summary))
        else:
            click.echo(_format_summary(summary, out_dir))
            click.echo("\n" + _format_baseline(summary, base_outcome.summary, base_dir))
    elif as_json:
        click.echo(summary_json(summary))
    else:
        click.echo(_format_summary(summary, out_dir))
    for warning in summary["trace_warnings"]:
        click.echo(f"warning: {warning}", err=True)
    for warning in summary["run_warnings"][int(failed) :]:
        click.echo(f"warning: {warning}", err=True)
    if failed:
        raise KvsimError(f"{summary['run_warnings'][0]} (results in {out_dir})")


def _resolve_as_typed(config: Any, given: set[str], config_path: str | None) -> Any:
    """`kvsim.resolve.resolve`, its error naming the setting as the user typed it: the flag
    when it came from the command line (`engine.seed: ...` -> `--seed: ...`), else the file."""
    from kvsim.resolve import resolve

    try:
        return resolve(config)
    except ConfigError as exc:
        text = str(exc)
        key, sep, rest = text.partition(": ")
        name = key.removeprefix("engine.")
        dest = {"max_num_batched_tokens": "max_batched_tokens"}.get(name, name)
        if sep and name in given:
            flags = {p.name: p.opts for p in click.get_current_context().command.params}
            text = f"{max(flags.get(dest, ['--' + dest]), key=len)}: {rest}"
        elif sep and config_path and key.replace(".", "_").isidentifier():
            text = f"{config_path}: {text}"
        raise ConfigError(text) from None


# -- kvsim compare ---------------------------------------------------------------------------------
def _settings(items: tuple[str, ...], option: str, lists: bool) -> dict[str, object]:
    """'policy=lru,belady' pairs as {key: [values]} (or {key: value}); in tiers '+' joins.
    Values that hold commas themselves (compression labels) are separated by ';' instead:
    'compression=none;quant:k=4,v=4'."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise KvsimError(
                f"--{option}: expected KEY=VALUE{',VALUE' if lists else ''}, got {item!r}"
            )
        if key in out:
            raise KvsimError(f"--{option}: {key} given twice")
        sep = ";" if ";" in value or key == "compression" else ","
        parts = [v.strip() for v in value.split(sep)] if lists else [value.strip()]
        if key == "tiers":
            parts = [v.replace("+", ",") for v in parts]
        if any(not v for v in parts):
            raise KvsimError(f"--{option}: {key}: an empty value in {value!r}")
        out[key] = parts if lists else parts[0]
    return out


@cli.command()
@click.option("--trace", default="sharegpt", show_default=True, help="Built-in trace or file.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Base config TOML.")
@click.option("--max-requests", type=int, help="Replay only the first N requests.")
@click.option("--rate-scale", type=float, help="Multiply the arrival rate.")
@click.option("--model", help="Catalog model name or model TOML. [default: llama-3.1-8b]")
@click.option("--hardware", help="Hardware profile name or TOML. [default: h100-sxm]")
@click.option("--slo-ttft", "slo_ttft_s", type=float, help="TTFT objective in seconds (goodput).")
@click.option("--slo-tpot", "slo_tpot_s", type=float, help="TPOT objective in seconds (goodput).")
@click.option("--seed", type=int, help="Seed for every random draw. [default: 0]")
@click.option(
    "--vary",
    multiple=True,
    required=True,
    help="KEY=V1,V2,...: policy, tiers (hbm+dram), router, replicas, hardware, any run key; "
    "values holding commas go between ';': compression=none;quant:k=4,v=4;h2o.",
)
@click.option("--baseline", multiple=True, help="KEY=VALUE: the baseline. [the first row]")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
@click.option("--markdown", is_flag=True, help="Print the table as Markdown.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("-j", "--jobs", type=int, help="Parallel workers. [default: the CPU count]")
def compare(
    trace: str,
    config_path: str | None,
    vary: tuple[str, ...],
    baseline: tuple[str, ...],
    as_json: bool,
    markdown: bool,
    executor: str,
    jobs: int | None,
    **options,
) -> None:
    """Run every combination of --vary and print one row each, with ratios to the baseline."""
    from kvsim.compare import compare as run_compare
    from kvsim.run import RunConfig

    if as_json and markdown:
        raise KvsimError("--json and --markdown: give one")
    _positive("rate-scale", options["rate_scale"])
    if jobs is not None and jobs < 1:
        raise KvsimError(f"--jobs: expected a positive integer, got {jobs}")
    base = RunConfig.from_toml(config_path) if config_path else RunConfig()
    given = {k: v for k, v in options.items() if v is not None}
    if "seed" in given:
        base = dataclasses.replace(
            base, engine=dataclasses.replace(base.engine, seed=given.pop("seed"))
        )
    base = dataclasses.replace(base, trace=trace, **given)
    table = run_compare(
        base,
        _settings(vary, "vary", lists=True),  # type: ignore[arg-type]
        _settings(baseline, "baseline", lists=False) or None,
        executor=executor,
        jobs=jobs,
        progress=not (as_json or markdown),
    )
    if as_json:
        click.echo(table.to_json())
    elif markdown:
        click.echo(table.to_markdown())
    else:
        click.echo(table.format())


# -- kvsim sweep -----------------------------------------------------------------------------------
@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="Sweep folder (resumable)."
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: a process pool; ray: a Ray cluster (pip install 'kvsim[ray]').",
)
@click.option("-j", "--jobs", type=int, help="Parallel workers. [default: the CPU count]")
@click.option("--ray-address", help="Join this Ray cluster. [default: start a local Ray]")
@click.option(
    "--keep-requests", is_flag=True, help="Also keep each run's requests and timeline Parquet."
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def sweep(
    spec: str,
    out: str,
    executor: str,
    jobs: int | None,
    ray_address: str | None,
    keep_requests: bool,
    quiet: bool,
) -> None:
    """Run every configuration of SPEC.toml and write DIR/results.parquet, one row each.

    Finished configurations in --out are not run again, so an interrupted sweep resumes. A
    configuration that fails is recorded with its error; the sweep then exits 2.
    """
    from kvsim.sweep import RESULTS_FILE, load_spec, open_executor, run_sweep
    from kvsim.sweep.table import format_results

    configurations = load_spec(spec)  # every configuration checked before anything runs
    if ray_address is not None and executor != "ray":
        raise KvsimError("--ray-address: only with --executor ray")
    with open_executor(executor, jobs=jobs, ray_address=ray_address) as pool:
        results = run_sweep(
            configurations,
            out,
            spec_file=spec,
            executor=pool,
            keep_requests=keep_requests,
            progress=not quiet,
        )
    click.echo(format_results(results))
    failed = [r for r in results if not r.ok]
    resumed = sum(r.resumed for r in results)
    table = Path(out) / RESULTS_FILE
    click.echo(
        f"{len(results)} configurations ({resumed} resumed, {len(failed)} failed); "
        f"results in {table}"
    )
    if failed:
        raise KvsimError(
            f"{len(failed)} of {len(results)} configurations failed (first: {failed[0].id}: "
            f"{failed[0].error}); their errors are in {table}"
        )


# -- kvsim size ------------------------------------------------------------------------------------
@cli.command()
@click.option("--model", required=True, help="Catalog model name or model TOML.")
@click.option("--tp", type=int, default=1, show_default=True)
@click.option(
    "--kv-dtype",
    type=click.Choice(["bf16", "fp16", "fp8", "int8", "int4"]),
    default="bf16",
    show_default=True,
)
@click.option(
    "--weight-dtype",
    type=click.Choice(_WEIGHT_DTYPES),
    help="Weight dtype. [default: the model's native one: fp8 for deepseek-v3, else bf16]",
)
@click.option("--hardware", default="h100-sxm", show_default=True, help="Hardware profile.")
@click.option(
    "--context",
    type=int,
    default=32768,
    show_default=True,
    help="Context length for the max-concurrency figure.",
)
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option(
    "--tiers", "show_tiers", is_flag=True, help="Also show KV capacity per tier per node."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--compression",
    default="none",
    show_default=True,
    help="KV compression NAME[:key=value,...] (docs/compression.md): adds its sizes at --context.",
)
def size(
    model,
    tp,
    kv_dtype,
    weight_dtype,
    hardware,
    context,
    block_size,
    show_tiers,
    as_json,
    compression,
) -> None:
    """Exact KV bytes per token and block, weights, and how many sequences fit in HBM.

    The sizes are always printed; when the weights leave no room for KV at this --tp, the report
    says so as a finding, with the smallest tp that fits (exit 0: it is an answer, not an error).
    """
    from kvsim.capacity import (
        format_capacity,
        format_tier_capacity,
        node_tier_capacity,
        profile_capacity_report,
    )
    from kvsim.compression import parse_compression
    from kvsim.compression.report import compression_report, format_compression
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    for name, value in (("tp", tp), ("context", context), ("block-size", block_size)):
        if value < 1:
            raise KvsimError(f"--{name}: expected a positive integer, got {value}")
    spec = load_model(model)
    comp = parse_compression(compression)
    weight_dtype = weight_dtype or spec.weight_dtype
    profile = load_profile(hardware)
    report = profile_capacity_report(
        spec,
        profile,
        tp=tp,
        kv_dtype=kv_dtype,
        weight_dtype=weight_dtype,
        context_tokens=context,
        block_size=block_size,
        strict=False,
    )
    report = {"hardware": profile.name, **report}
    if not comp.identity:
        report["compression"] = compression_report(
            spec, comp, context, kv_dtype, tp, report["kv_capacity_bytes_per_rank"]
        )
    tiers_skipped = show_tiers and not report["fits"]
    show_tiers = show_tiers and report["fits"]  # HBM left for KV is part of the tier table
    if tiers_skipped:
        report["tiers"] = None
    if show_tiers:
        report["tiers"] = node_tier_capacity(
            spec,
            profile,
            tp=tp,
            kv_dtype=kv_dtype,
            weight_dtype=weight_dtype,
            block_size=block_size,
        )
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(format_capacity(report))
    if "compression" in report:
        click.echo("\n" + format_compression(report["compression"]))
    if show_tiers:
        click.echo("\n" + format_tier_capacity(report["tiers"]))
    if tiers_skipped:
        click.echo(
            "\nno tier table: it starts from the HBM left after weights; use a --tp that fits"
        )


# -- kvsim profile ---------------------------------------------------------------------------------
@cli.group()
def profile() -> None:
    """Hardware profiles: list, show, validate."""


@profile.command("list")
def profile_list() -> None:
    """Every shipped profile with its GPU, HBM and price."""
    from kvsim.hardware.show import format_profile_list

    click.echo(format_profile_list())


@profile.command("show")
@click.argument("name")
@click.option("--model", help="Also price one iteration of this model at a few batch shapes.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel GPUs.")
@click.option("--engine", default=None, help="Serving engine profile. [default: vllm]")
@click.option("--kv-dtype", default="bf16", show_default=True)
@click.option("--weight-dtype", default=None, help="[default: the model's native dtype]")
def profile_show(
    name: str,
    model: str | None,
    tp: int,
    engine: str | None,
    kv_dtype: str,
    weight_dtype: str | None,
) -> None:
    """Every number of a profile, its tiers and the source of each figure; with --model, where
    one iteration's time goes (weights, KV reads, attention, all-reduce, fixed costs, CPU)."""
    from kvsim.hardware import load_profile
    from kvsim.hardware.show import format_profile

    hardware = load_profile(name)
    if model is None:
        if engine is not None or tp != 1:
            raise KvsimError("--engine and --tp price an iteration: give --model too")
        click.echo(format_profile(hardware))
        return
    click.echo(_format_iteration(hardware, model, tp, engine, kv_dtype, weight_dtype))


def _format_iteration(
    hardware: Any, model_name: str, tp: int, engine_name: str | None, kv: str, weight: str | None
) -> str:
    """`kvsim profile show --model`: one iteration's parts at a few batch shapes."""
    from kvsim.costmodel import make_cost_model
    from kvsim.costmodel.breakdown import format_breakdowns
    from kvsim.engine.config import EngineConfig
    from kvsim.engine.resolve import engine_profile
    from kvsim.engines import DEFAULT_ENGINE
    from kvsim.models import load_model

    _positive("tp", tp)
    spec = load_model(model_name)
    engine = engine_profile(EngineConfig(engine=engine_name or DEFAULT_ENGINE))
    cost = make_cost_model(
        spec,
        hardware,
        tp=tp,
        kv_dtype=kv,
        weight_dtype=weight or spec.weight_dtype,
        engine=engine,
    )
    clock = cost.roofline.clock if hasattr(cost, "roofline") else cost.clock
    cpu = "overlapped with the GPU" if clock.overlap else "added to the GPU time"
    header = (
        f"{spec.name} on {hardware.name}, TP {tp}, engine {engine.full_name}\n"
        f"cost model: {cost.kind} ({cost.reason}); kernel terms: {cost.kernel_terms}\n"
        f"engine CPU per iteration {clock.overhead_s * 1e3:g} ms, {cpu}; CUDA graphs up to "
        f"{engine.cuda_graph_max_tokens} tokens; front end {cost.request_overhead_s * 1e3:g} ms "
        f"per request"
    )
    return format_breakdowns(cost, header)


@profile.command("validate")
@click.argument("path", type=click.Path(dir_okay=False))
def profile_validate(path: str) -> None:
    """Check a profile file; names the field of the first impossible value."""
    from kvsim.hardware import validate_profile

    prof = validate_profile(path)
    click.echo(f"{path}: ok ({prof.name}, {len(prof.tiers)} tiers)")


@cli.group()
def engine() -> None:
    """Serving-engine profiles: list, show."""


@engine.command("list")
def engine_list() -> None:
    """Every shipped engine profile: name@version, whether it is the current one, summary."""
    from kvsim.engines import engine_names, load_engine

    for name in engine_names():
        if "@" not in name:
            continue
        p = load_engine(name)
        mark = " (current)" if p.current else ""
        click.echo(f"{name:<12}{mark:<11}{p.description}")


@engine.command("show")
@click.argument("name")
def engine_show(name: str) -> None:
    """Every setting of an engine profile and the source of each."""
    from kvsim.engines import load_engine

    p = load_engine(name)
    click.echo(f"{p.full_name}: {p.description}")
    click.echo(f"file: {p.source_path}")
    settings = {
        "kernels": p.kernels or "(the hardware profile's [efficiency])",
        "cuda_graph_max_tokens": p.cuda_graph_max_tokens,
        "eager_launch_s": p.eager_launch_s,
        "iteration_overhead_s": p.iteration_overhead_s,
        "overlap_scheduling": p.overlap_scheduling,
        "request_overhead_s": p.request_overhead_s,
        "allreduce": ", ".join(p.allreduce) or "(any the hardware profile lists)",
        **{f"defaults.{k}": v for k, v in p.defaults.items()},
    }
    for key, value in settings.items():
        click.echo(f"  {key} = {value}")
        if key in p.sources:
            click.echo(f"      {p.sources[key]}")


def _register_subcommands() -> None:
    from kvsim.calibrate.cli import calibrate
    from kvsim.mrc.cli import mrc
    from kvsim.plan.cli import plan
    from kvsim.report.cli import report
    from kvsim.traces.cli import trace

    cli.add_command(calibrate)
    cli.add_command(mrc)
    cli.add_command(plan)
    cli.add_command(report)
    cli.add_command(trace)


_register_subcommands()


def main(argv: list[str] | None = None) -> None:
    """One-line errors with exit code 2 for anything the user got wrong. A Ctrl-C propagates to
    the console script's entry point, kvsim.__main__, which ends it in one line and exit 130."""
    try:
        cli.main(args=argv, prog_name="kvsim", standalone_mode=False)
    except KvsimError as exc:
        click.echo(f"kvsim: error: {exc}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        from kvsim.textio import one_line  # click quotes arguments, newlines and all

        click.echo(f"kvsim: error: {one_line(exc.format_message())}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("kvsim: aborted", err=True)
        sys.exit(130)

"""`kvsim mrc`: hit ratios of policies at capacities by cache-only replay, in seconds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from kvsim.errors import ConfigError
from kvsim.mrc.replay import SEMANTICS, BlockSequence, ReplayResult, next_use, replay
from kvsim.policies import make_policy, parse_policy_params, resolve_policy
from kvsim.traces import load_trace


def _split(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise ConfigError(f"--{what}: expected a comma-separated list, got {value!r}")
    return items


def _capacity(text: str) -> int:
    try:
        blocks = int(text)
    except ValueError:
        raise ConfigError(f"--capacity: expected a whole number of blocks, got {text!r}") from None
    if blocks < 1:
        raise ConfigError(f"--capacity: must be at least 1 block, got {blocks}")
    return blocks


def _check_block_size(block_size: int | None) -> None:
    if block_size is not None and (isinstance(block_size, bool) or block_size < 1):
        raise ConfigError(f"--block-size: expected a positive number of tokens, got {block_size}")


#: The formats `plot_mrc` writes, by file suffix.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str | Path) -> Path:
    """`path` if a figure can be written there, else ConfigError naming it: an image suffix
    (.png, .svg, .pdf), an existing folder, and not a folder itself. Called before any replay."""
    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(
            f"--plot {path}: expected a file ending in {', '.join(PLOT_SUFFIXES)}, "
            f"got {path.suffix or 'no suffix'!r}"
        )
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"--plot {path}: folder {folder} does not exist; create it first")
    if path.is_dir():
        raise ConfigError(f"--plot {path}: is a folder; give a file name such as mrc.png")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--plot {path}: folder {folder} is not writable")
    return path


def run_mrc(
    trace: str,
    policies: list[str],
    capacities: list[int],
    semantics: str = "plain",
    block_size: int | None = None,
    max_requests: int | None = None,
    params: dict[str, dict[str, Any]] | None = None,
) -> list[ReplayResult]:
    """Every policy at every capacity; the Python API behind the command. `params` maps a
    policy name to its parameters (its `Params` dataclass fields)."""
    params = params or {}
    unused = sorted(set(params) - set(policies))
    if unused:
        raise ConfigError(f"--policy-param: {unused[0]!r} is not among the policies replayed")
    if semantics not in SEMANTICS:
        raise ConfigError(f"semantics must be one of {', '.join(SEMANTICS)}, got {semantics!r}")
    _check_block_size(block_size)
    for name in policies:
        # fail on a bad name or parameter (type, NaN, infinity) before any work
        resolve_policy(name)
        if params.get(name):
            make_policy(name, params[name])
    loaded = load_trace(trace, max_requests=max_requests)
    size = block_size or loaded.native_block_size or 16
    seq = BlockSequence.from_trace(loaded, size)
    future = None
    results = []
    for name in policies:
        for capacity in capacities:
            policy = make_policy(name, params.get(name))
            if policy.needs_future and future is None:
                future = next_use(seq.keys)
            result = replay(seq, policy, capacity, semantics, future=future)
            results.append(
                ReplayResult(name, capacity, semantics, result.accesses, result.hits, result.extra)
            )
    return results


def plot_mrc(results: list[ReplayResult], path: str | Path, title: str) -> None:
    """Hit ratio against capacity, one line per policy, written as PNG, SVG or PDF (by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvsim.atomic import write_file

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.policy for r in results):
        rows = sorted((r.capacity, r.hit_ratio) for r in results if r.policy == name)
        style = {"color": "black", "linestyle": "--", "linewidth": 2} if name == "belady" else {}
        ax.plot([c for c, _ in rows], [h for _, h in rows], marker="o", label=name, **style)
    ax.set_xscale("log")
    ax.set_xlabel("capacity (blocks)")
    ax.set_ylabel("hit ratio (per block access)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    try:  # whole or not at all (the temporary keeps the suffix savefig reads the format from)
        write_file(Path(path), lambda tmp: fig.savefig(tmp, dpi=120), what="the plot")
    finally:
        plt.close(fig)


@click.command("mrc")
@click.option("--trace", "trace", required=True, help="Trace name or file.")
@click.option("--policy", "policy", required=True, help="Policy name(s), comma-separated.")
@click.option(
    "--capacity", "capacity", required=True, help="Cache size(s) in blocks, comma-separated."
)
@click.option(
    "--semantics",
    type=click.Choice(SEMANTICS),
    default="plain",
    show_default=True,
    help="plain: every block access is a cache request; prefix: requests one at a time through "
    "the engine's KV-cache manager (hits stop at the first miss, capped at input - 1 tokens).",
)
@click.option(
    "--block-size",
    type=int,
    default=None,
    help="Tokens per block (default: the trace's native size, else 16).",
)
@click.option("--max-requests", type=int, default=None, help="Replay only the first N requests.")
@click.option(
    "--policy-param",
    "policy_params",
    multiple=True,
    metavar="POLICY.NAME=VALUE",
    help="A policy parameter, e.g. ema-head.tolerate_loss=0.001 (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the miss-ratio curves here (.png, .svg or .pdf; the folder must exist).",
)
def mrc(
    trace: str,
    policy: str,
    capacity: str,
    semantics: str,
    block_size: int | None,
    max_requests: int | None,
    policy_params: tuple[str, ...],
    as_json: bool,
    plot: str | None,
) -> None:
    """Replay a trace's block accesses through eviction policies, without the engine."""
    policies = _split(policy, "policy")
    capacities = [_capacity(c) for c in _split(capacity, "capacity")]
    _check_block_size(block_size)
    if plot:
        check_plot_path(plot)
    start = time.perf_counter()
    # KvsimError propagates: kvsim.cli.main prints it as one line and exits 2. Nothing is written
    # until every replay has finished, so a failing plugin leaves no complete-looking output.
    params = parse_policy_params(policy_params)
    results = run_mrc(trace, policies, capacities, semantics, block_size, max_requests, params)
    wall_s = time.perf_counter() - start
    if plot:
        plot_mrc(results, plot, f"{trace} ({semantics})")
    if as_json:
        click.echo(json.dumps({"results": [r.as_dict() for r in results], "wall_s": wall_s}))
        return
    click.echo(f"{'policy':<16} {'capacity':>10} {'accesses':>10} {'hits':>10} {'hit_ratio':>10}")
    for r in results:
        click.echo(
            f"{r.policy:<16} {r.capacity:>10} {r.accesses:>10} {r.hits:>10} {r.hit_ratio:>10.4f}"
        )
    refused = {r.capacity: int(r.extra["unserved_requests"]) for r in results if r.extra}
    for capacity, count in sorted(refused.items()):
        if count:
            click.echo(
                f"note: at {capacity} blocks, {count} requests need more blocks than the cache "
                "holds; an engine refuses them, so they count as misses",
                err=True,
            )

"""`kvsim trace`: list, stats, convert and synth (a thin layer over the Python API)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kvsim.errors import KvsimError

__all__ = ["trace"]

_SYNTH_KINDS = ("sharegpt", "lmsys", "agentic", "mooncake-toolagent")


@click.group("trace")
def trace() -> None:
    """Inspect, convert and generate workload traces."""


@trace.command("list")
def list_() -> None:
    """Every built-in trace, with what is real and what is drawn."""
    from kvsim.traces.registry import trace_info, trace_names

    width = max(len(n) for n in trace_names())
    for name in trace_names():
        click.echo(f"{name:<{width}}  {trace_info(name).summary}")


def _load(source: str, fmt: str | None, tokenizer: str | None, skip: bool, seed: int = 0):
    from kvsim.traces.registry import load_trace

    return load_trace(source, format=fmt, tokenizer=tokenizer, skip_bad_rows=skip, seed=seed)


@trace.command()
@click.argument("source")
@click.option("--format", "fmt", help="Source format (default: detected from the file).")
@click.option("--block-size", type=int, help="Block size for the reuse ceiling [native or 16].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(file_okay=False), help="Write PNG histograms here.")
@click.option("--tokenizer", type=click.Path(dir_okay=False), help="tokenizer.json for text.")
@click.option("--skip-bad-rows", is_flag=True, help="Count malformed rows instead of failing.")
def stats(source, fmt, block_size, as_json, plot, tokenizer, skip_bad_rows) -> None:
    """Requests, sessions, lengths, burstiness and the reuse ceiling of NAME or PATH."""
    from kvsim.traces.stats import trace_stats

    if block_size is not None and block_size < 1:
        raise KvsimError(f"--block-size: expected a positive integer, got {block_size}")
    if plot:
        _check_plot_dir(Path(plot))
    tr = _load(source, fmt, tokenizer, skip_bad_rows)
    _warn(tr.warnings)
    figures = trace_stats(tr, block_size)
    if plot:
        _plot(tr, Path(plot))
    if as_json:
        click.echo(json.dumps(figures))
        return
    f = figures
    click.echo(f"{f['name']}: {f['description']}")
    click.echo(
        f"requests {f['requests']:,}  sessions {f['sessions']:,}  "
        f"turns/session {f['turns_per_session']:.2f}  duration {f['duration_s']:.1f} s"
    )
    for label in ("input_tokens", "output_tokens"):
        click.echo(
            f"{label:<14} mean {f[label + '_mean']:.1f}  p50 {f[label + '_p50']:.0f}  "
            f"p90 {f[label + '_p90']:.0f}  p99 {f[label + '_p99']:.0f}  max {f[label + '_max']}"
        )
    click.echo(f"session inter-arrival CV {f['session_interarrival_cv']:.2f}")
    click.echo(
        f"reuse ceiling (infinite cache, block {f['block_size']}): "
        f"{f['reuse_ceiling']:.3f} of prompt tokens"
    )
    if f["skipped_rows"]:
        click.echo(f"skipped {f['skipped_rows']} malformed rows")


def _warn(warnings: tuple[str, ...]) -> None:
    """Plausibility warnings on stderr: the command still succeeds."""
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def _check_out_file(out: Path) -> None:
    """One line naming `out` when a file cannot be written there; checked before any work."""
    if not out.parent.is_dir():
        raise KvsimError(f"{out}: folder {out.parent} does not exist; create it first")
    if out.is_dir():
        raise KvsimError(f"{out}: is a folder; give a file name such as trace.parquet")


def _check_plot_dir(out: Path) -> None:
    """One line naming `out` when the histogram folder cannot be made there."""
    if out.exists() and not out.is_dir():
        raise KvsimError(f"--plot {out}: is a file; give a folder for the histograms")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvsimError(f"--plot {out}: cannot create the folder: {exc.strerror or exc}") from None


def _plot(tr, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from kvsim.atomic import write_file

    for column in ("input_tokens", "output_tokens"):
        values = tr.table.column(column).to_numpy()
        fig, ax = plt.subplots(figsize=(6, 4))
        low = max(1, int(values.min()))  # start where the data does, not at 1 token
        bins = np.logspace(np.log10(low), np.log10(max(low + 1, values.max())), 50)
        ax.hist(np.maximum(values, 1), bins=bins)
        ax.set_xscale("log")
        ax.set_xlabel(f"{column} (log scale)")
        ax.set_ylabel("requests")
        ax.set_title(f"{tr.name}: {column}")
        fig.tight_layout()
        try:  # each histogram whole or not at all
            write_file(out / f"{column}.png", lambda tmp, fig=fig: fig.savefig(tmp, dpi=100))
        finally:
            plt.close(fig)


@trace.command()
@click.argument("source")
@click.option("--format", "fmt", help="Source format (default: detected from the file).")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False))
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for drawn times.")
@click.option("--tokenizer", type=click.Path(dir_okay=False), help="tokenizer.json for text.")
@click.option("--skip-bad-rows", is_flag=True, help="Count malformed rows instead of failing.")
def convert(source, fmt, out, seed, tokenizer, skip_bad_rows) -> None:
    """Convert PATH (or a built-in NAME) to canonical Parquet, streaming."""
    from kvsim.traces.convert import convert_to_parquet, read_trace_warnings
    from kvsim.traces.registry import load_trace, open_source, trace_names

    if source in trace_names() and fmt is None:
        src = load_trace(source, seed=seed)
    else:
        src = open_source(source, format=fmt, seed=seed, tokenizer=tokenizer,
                          skip_bad_rows=skip_bad_rows)  # fmt: skip
    written, skipped = convert_to_parquet(src, out)
    line = f"wrote {written:,} requests to {out}"
    if skipped:
        line += f"; skipped {skipped:,} malformed rows"
    click.echo(line)
    _warn(read_trace_warnings(out))


@trace.command()
@click.argument("kind", type=click.Choice(_SYNTH_KINDS))
@click.option("--requests", "n", type=int, required=True, help="Requests to generate.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rate", type=float, help="Session arrival rate per s [generator default].")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False))
def synth(kind, n, seed, rate, out) -> None:
    """Generate KIND with N requests to canonical Parquet (same seed, same file).

    lmsys is streamed in row groups, never held whole (a day is 20 M requests); the other
    kinds are built in memory.
    """
    from kvsim.atomic import write_file
    from kvsim.traces.registry import load_trace
    from kvsim.traces.schema import write_trace

    if n < 1:
        raise KvsimError(f"--requests: expected a positive integer, got {n}")
    _check_out_file(Path(out))
    if kind == "lmsys":
        from kvsim.traces.convert import convert_to_parquet
        from kvsim.traces.registry import stream_lmsys_trace

        written, _ = convert_to_parquet(stream_lmsys_trace(n, seed=seed, rate=rate), out,
                                        max_requests=n)  # fmt: skip
    else:
        tr = load_trace(kind, max_requests=n, seed=seed, rate=rate)
        write_file(Path(out), lambda tmp: write_trace(tr, tmp), what="the trace")  # whole or none
        written = len(tr)
    click.echo(f"wrote {written:,} {kind} requests (seed {seed}) to {out}")

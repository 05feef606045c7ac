"""`kvsim report`: the click layer over `kvsim.report.write_report`."""

from __future__ import annotations

import click


@click.command()
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--html", is_flag=True, help="One self-contained report.html, images embedded.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Folder for the report. [default: FOLDER/report]",
)
def report(folder: str, html: bool, out: str | None) -> None:
    """Figures and a summary page for a run's folder (kvsim run --out) or a sweep's.

    A run gets TTFT/TPOT CDFs, throughput and queues over time, tier occupancy, bytes per
    link, hit ratio and attribution, cost, and per-replica load; a sweep one figure per
    varied key. Writes report.md with PNGs beside it, or report.html with --html.

    What the report leaves out (failed configurations, a run in which nothing completed) is
    said on stderr; a sweep in which every configuration failed is an error (exit 2).
    """
    import json
    from pathlib import Path

    from kvsim.report import is_sweep, write_report
    from kvsim.report.page import quality_line

    page = write_report(
        folder, out, html=html, warn=lambda line: click.echo(f"warning: {line}", err=True)
    )
    click.echo(f"report written to {page}")
    if not is_sweep(folder):
        summary = json.loads((Path(folder) / "summary.json").read_text())  # read by the report
        if "compression" in summary:  # a run written before issue 14 has no quality proxy
            click.echo(f"quality proxy ({summary['compression']}): {quality_line(summary)}")

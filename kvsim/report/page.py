"""The report page: the figures, the summary table and the resolved config, in Markdown (PNGs
beside it) or one self-contained HTML file (PNGs embedded as base64).

Every figure is drawn and rendered before the output folder is touched, so a run or sweep
that cannot be read leaves nothing written; the page and its figures are then written into a
temporary folder renamed onto the report's folder when complete (`kvsim.atomic`), so a killed
report leaves no folder holding half of them. A report folder that already exists is replaced
only when it holds nothing but report files.

What a report cannot show is said, through ``warn``: failed configurations of a sweep (left
out of its figures), a run in which no request completed. A sweep in which no configuration
succeeded has nothing to draw: a `ReportError`, and nothing written.
"""

from __future__ import annotations

import base64
import html as htmllib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from kvsim.atomic import AtomicFolder, WriteError
from kvsim.report.data import ReportError, RunData, SweepData, is_sweep, load_run, load_sweep
from kvsim.report.run_figures import run_figures, run_label
from kvsim.report.style import png_bytes
from kvsim.report.sweep_figures import SWEEP_METRICS, sweep_figures
from kvsim.units import format_bytes

#: What each run figure shows, as the page's caption for it.
CAPTIONS = {
    "latency_cdf": "TTFT and TPOT CDFs of completed requests",
    "throughput_queue": "Output throughput and queue lengths over time",
    "tier_occupancy": "Tier occupancy over time",
    "link_bytes": "Bytes moved per link",
    "hit_ratio": "Hit ratio per tier and the hit attribution",
    "cost": "Cost breakdown: GPUs and each tier",
    "per_replica": "Load per replica",
}
REPORT_FOLDER = "report"


def figures(folder: str | Path) -> dict[str, Figure]:
    """A run's figures, or a sweep's (one per varied key), by name."""
    if is_sweep(folder):
        return sweep_figures(load_sweep(folder))
    return run_figures(load_run(folder))


def write_report(
    folder: str | Path,
    out: str | Path | None = None,
    html: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """Write the report of a run or sweep `folder` into `out` (default ``folder/report``):
    report.md and one PNG per figure, or with `html` the single file report.html. Returns
    the page's path. What the report leaves out is passed to `warn`, one line each."""
    say = warn if warn is not None else (lambda line: None)
    if is_sweep(folder):
        sweep = load_sweep(folder)
        for line in sweep_gaps(sweep):
            say(line)
        drawn = sweep_figures(sweep)
        title = f"Sweep report: {sweep.folder}"
        sections = [("Results", _sweep_table(sweep))]
        captions = {name: f"Against {name.removeprefix('vary_')}" for name in drawn}
    else:
        run = load_run(folder)
        for line in run_gaps(run):
            say(line)
        drawn = run_figures(run)
        title = f"Run report: {run.folder}"
        sections = [
            ("Summary", _summary_table(run)),
            ("Resolved config", ("toml", run.config_toml)),
        ]
        captions = {name: CAPTIONS.get(name, name) for name in drawn}
    images = {name: png_bytes(fig) for name, fig in drawn.items()}
    out_dir = Path(out) if out is not None else Path(folder) / REPORT_FOLDER
    page = out_dir / ("report.html" if html else "report.md")

    def fill(tmp: Path) -> None:
        if html:
            (tmp / page.name).write_text(_html(title, sections, images, captions))
            return
        for name, data in images.items():
            (tmp / f"{name}.png").write_bytes(data)
        (tmp / page.name).write_text(_markdown(title, sections, images, captions))

    ReportFolder(out_dir).fill(fill, "cannot write the report")
    return page


class ReportFolder(AtomicFolder):
    """A report's folder: new, empty, or an earlier report (only report files in it), which
    is replaced whole."""

    what = "the report"

    def __init__(self, out: str | Path) -> None:
        super().__init__(out, overwrite=True)

    def check_target(self) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise WriteError(f"{out}: is a file, not a folder; give a folder for the report")
        foreign = [name for name in self.entries() if not _report_file(name)]
        if foreign:
            raise WriteError(
                f"{out}: holds {foreign[0]!r}, which is not a report file; give a new or empty "
                "folder for the report (--out)"
            )


def _report_file(name: str) -> bool:
    return name in ("report.md", "report.html") or name.endswith(".png")


def run_gaps(run: RunData) -> list[str]:
    """What a run's report cannot show, one line each (empty for a run that completed)."""
    s = run.summary
    if not s.get("requests") or s.get("completed"):
        return []
    why = (s.get("run_warnings") or ["no reason recorded"])[0]
    return [
        f"{run.folder}: no request completed ({' '.join(str(why).split())}); the latency and "
        "throughput figures are empty"
    ]


def sweep_gaps(sweep: SweepData) -> list[str]:
    """What a sweep's figures leave out: its failed configurations, one line each with the
    error. A ReportError when none succeeded (nothing to draw)."""
    table = sweep.table
    failed = table[table["status"] != "ok"]
    lines = [f"configuration {r['id']} failed, left out of the figures: {r['error']}"
             for _, r in failed.iterrows()]  # fmt: skip
    if len(failed) == len(table):
        first = f" (first: {failed.iloc[0]['id']}: {failed.iloc[0]['error']})" if len(table) else ""
        raise ReportError(
            f"{sweep.folder}: no configuration succeeded, nothing to report: "
            f"{len(failed)} of {len(table)} failed{first}"
        )
    if not sweep.varied:
        lines.append(
            "no parameter takes two values among the configurations that succeeded: the page "
            "has the table and no figure"
        )
    return lines


# -- tables ----------------------------------------------------------------------------------------
Table = tuple[list[str], list[list[str]]]
Section = Table | tuple[str, str]  # a table, or (language, verbatim text)


def _fmt(value: Any, scale: float = 1.0, spec: str = ",.4g", unit: str = "") -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-" if value is None else str(value)
    v = value * scale if scale != 1.0 else value
    return "-" if math.isnan(v) else f"{v:{spec}}{unit}"


def quality_line(summary: dict[str, Any]) -> str:
    """The run's quality proxy in words (kvsim.run.format_quality)."""
    from kvsim.run import format_quality

    return format_quality(summary)


def _summary_table(run: RunData) -> Table:
    s = run.summary
    rows = [
        ["workload", run_label(s)],
        [
            "requests",
            f"{s['requests']:,} ({s['completed']:,} completed, {s['rejected']:,} refused)",
        ],
        ["simulated time", _fmt(s.get("simulated_s"), spec=",.1f", unit=" s")],
    ]
    for what, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E latency", "e2e")):
        qs = ("p50", "p90", "p99") if key == "ttft" else ("p50", "p99")
        rows.append(
            [
                f"{what} {' / '.join(qs)}",
                " / ".join(_fmt(s.get(f"{key}_{q}_s"), 1000, ",.1f") for q in qs) + " ms",
            ]
        )
    rows += [
        [
            "output throughput",
            _fmt(s.get("throughput_tokens_per_s"), spec=",.0f", unit=" tokens/s"),
        ],
        [
            "total throughput",
            _fmt(s.get("total_throughput_tokens_per_s"), spec=",.0f", unit=" tokens/s"),
        ],
        ["prefix hit ratio", _fmt(s.get("prefix_hit_ratio"), 100, ".1f", "%")],
    ]
    for tier, ratio in (s.get("hit_ratio_by_tier") or {}).items():
        rows.append([f"  hits from {tier}", _fmt(ratio, 100, ".1f", "%")])
    if s.get("slo_attainment") is not None:
        rows.append(["SLO attainment", _fmt(s["slo_attainment"], 100, ".1f", "%")])
        rows.append(["goodput", _fmt(s.get("goodput_tokens_per_s"), spec=",.0f", unit=" tokens/s")])
    rows += [
        ["cost", _fmt(s.get("cost_usd"), spec=",.4g", unit=" USD")],
        [
            "cost per million tokens",
            _fmt(s.get("cost_per_million_tokens_usd"), spec=",.4g", unit=" USD"),
        ],
        ["evicted blocks", _fmt(s.get("evicted_blocks"), spec=",d")],
        ["preemptions", _fmt(s.get("preemptions"), spec=",d")],
        ["recomputed tokens", _fmt(s.get("recomputed_tokens"), spec=",d")],
    ]
    if "compression" in s:  # KV compression (issue 14): memory and the quality proxy
        rows += [
            ["KV compression", str(s["compression"])],
            ["KV per request (mean)", format_bytes(s.get("kv_bytes_per_request_mean") or 0)],
            ["KV per request (peak)", format_bytes(s.get("kv_bytes_per_request_peak") or 0)],
            ["peak KV in HBM", format_bytes(s.get("peak_hbm_kv_bytes") or 0)],
            ["quality proxy", quality_line(s)],
        ]
    for name, link in (s.get("links") or {}).items():
        read, written = (format_bytes(link.get(k) or 0) for k in ("bytes_read", "bytes_written"))
        moved = f"{read} read, {written} written"
        rows.append([f"link {name}", moved])
    rows += [["warning", w] for w in s.get("run_warnings") or []]
    return ["figure", "value"], rows


def _sweep_table(sweep: SweepData) -> Table:
    head = ["id", "status", *sweep.params, *(label for _, label, _, _ in SWEEP_METRICS)]
    rows = []
    for _, r in sweep.table.iterrows():
        row = [str(r["id"]), str(r["status"]), *(str(r[p]) for p in sweep.params)]
        for column, _, scale, spec in SWEEP_METRICS:
            ok = r["status"] == "ok"
            row.append(_fmt(r.get(column), scale, spec) if ok else str(r["error"]))
        rows.append(row)
    return head, rows


# -- pages -----------------------------------------------------------------------------------------
def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown(
    title: str,
    sections: list[tuple[str, Section]],
    images: dict[str, bytes],
    captions: dict[str, str],
) -> str:
    lines = [f"# {title}", ""]
    for name in images:
        lines += [f"## {captions[name]}", "", f"![{captions[name]}]({name}.png)", ""]
    for heading, body in sections:
        lines += [f"## {heading}", ""]
        first, second = body
        if isinstance(first, str):
            lines += [f"```{first}", str(second).rstrip("\n"), "```", ""]
        else:
            lines.append("| " + " | ".join(_md_cell(c) for c in first) + " |")
            lines.append("|" + "---|" * len(first))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in second]
            lines.append("")
    return "\n".join(lines)


def _html(
    title: str,
    sections: list[tuple[str, Section]],
    images: dict[str, bytes],
    captions: dict[str, str],
) -> str:
    esc = htmllib.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "img{max-width:100%}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}</style>",
        f"</head><body><h1>{esc(title)}</h1>",
    ]
    for name, data in images.items():
        encoded = base64.b64encode(data).decode("ascii")
        parts.append(f"<h2>{esc(captions[name])}</h2>")
        parts.append(f'<img alt="{esc(captions[name])}" src="data:image/png;base64,{encoded}">')
    for heading, body in sections:
        parts.append(f"<h2>{esc(heading)}</h2>")
        first, second = body
        if isinstance(first, str):
            parts.append(f"<pre>{esc(str(second))}</pre>")
        else:
            parts.append("<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in first) + "</tr>")
            for row in second:
                parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"

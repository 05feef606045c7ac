"""The combined results table: one row per configuration, its parameters and its summary.

Columns, in order: ``id``, ``status`` ("ok" or "failed"), ``error`` (the one-line error of a
failed configuration), the swept parameters under their spec keys, then the summary flattened
with dots (``ttft_p99_s``, ``hit_ratio_by_tier.dram``, ``tiers.dram.bytes_read``,
``slo_attainment``, ``goodput_tokens_per_s``, ``cost_per_million_tokens_usd``, …) and the
sweep's measurements (``sweep.run_s``: wall seconds in the worker, trace loading included;
``sweep.peak_rss_bytes``; ``sweep.worker``). Lists of text (warnings) are joined with " | ";
``per_replica`` stays in each run's summary.json. A summary key equal to a parameter's name
(``policy``, ``replicas``, ``trace``) is left out: the parameter column holds what was asked.

Everything but `MEASURED_COLUMNS` is a function of the configurations alone, so two sweeps of
one spec give equal tables whatever the executor, the number of workers, or interruptions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvsim.atomic import write_file

if TYPE_CHECKING:
    from kvsim.sweep.runner import ConfigResult

#: Columns that measure the machine, not the simulation: they differ from run to run.
MEASURED_COLUMNS = ("wall_s", "sweep.run_s", "sweep.peak_rss_bytes", "sweep.worker")
_DROPPED = frozenset({"per_replica"})


def results_table(results: Sequence[ConfigResult]) -> pd.DataFrame:
    """The table of `results`, in their order (see the module docstring)."""
    params: dict[str, None] = {}
    for r in results:
        params.update(dict.fromkeys(r.params))
    rows = []
    for r in results:
        row: dict[str, Any] = {"id": r.id, "status": r.status, "error": r.error}
        row.update({k: r.params.get(k) for k in params})
        if r.summary is not None:
            for key, value in flatten(r.summary).items():
                if key not in params and key not in row:
                    row[key] = value
        rows.append(row)
    return pd.DataFrame(rows)


def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists of text joined; ``per_replica`` left out."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key in _DROPPED:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            out[name] = " | ".join(str(v) for v in value)
        else:
            out[name] = value
    return out


def write_table(table: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write `table` as Parquet atomically (`kvsim.atomic.write_file`): a reader sees the old
    file or the whole new one; a failed write is one WriteError line naming `path`."""
    path = Path(path)
    write_file(path, lambda tmp: table.to_parquet(tmp, index=False), what="the results table")
    return path


def format_results(results: Sequence[ConfigResult]) -> str:
    """A terminal table: each configuration's parameters and headline figures, or its error."""
    params: dict[str, None] = {}
    for r in results:
        params.update(dict.fromkeys(r.params))
    figures = [
        ("TTFT p99 ms", "ttft_p99_s", 1000.0, ",.0f"),
        ("TPOT p99 ms", "tpot_p99_s", 1000.0, ",.1f"),
        ("hit ratio", "prefix_hit_ratio", 1.0, ".3f"),
        ("$/M tok", "cost_per_million_tokens_usd", 1.0, ".4f"),
    ]
    if any(r.summary and r.summary.get("slo_attainment") is not None for r in results):
        figures.append(("SLO att.", "slo_attainment", 1.0, ".3f"))
    head = ["id", *params, *(name for name, *_ in figures)]
    rows = []
    for r in results:
        row = [r.id, *(str(r.params.get(k)) for k in params)]
        for _, key, scale, spec in figures:
            value = r.summary.get(key) if r.summary is not None else None
            row.append("-" if value is None else format(value * scale, spec))
        rows.append(row)
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
    lines = []
    for r, row in zip([None, *results], [head, *rows], strict=True):
        line = "  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip()
        lines.append(line + (f"  failed: {r.error}" if r is not None and not r.ok else ""))
    return "\n".join(lines)

"""The figures of a sweep: one per varied key, its headline figures against that key's values.

Each figure has three panels (TTFT p99, prefix hit ratio, cost per million tokens) with the
varied key on the x axis and one series per combination of the other varied keys. Failed
configurations are left out (their errors are in the table).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvsim.report.data import SweepData
from kvsim.report.style import new_figure, styled

#: (results column, axis label, scale, format): the headline figures drawn against each key.
SWEEP_METRICS = (
    ("ttft_p99_s", "TTFT p99 (ms)", 1000.0, ",.0f"),
    ("prefix_hit_ratio", "prefix hit ratio (% of input tokens)", 100.0, ".1f"),
    ("cost_per_million_tokens_usd", "cost (USD per million tokens)", 1.0, ",.4g"),
)

_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_STYLES = ("-", "--", "-.", ":")


def figure_name(key: str) -> str:
    """The PNG stem of a varied key's figure: 'vary_tier_capacity.dram'."""
    return "vary_" + re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def sweep_figures(sweep: SweepData) -> dict[str, Figure]:
    """One figure per varied key, by `figure_name`, in the table's parameter order."""
    ok = sweep.table[sweep.table["status"] == "ok"]
    with styled():
        return {figure_name(key): _against(ok, key, sweep) for key in sweep.varied}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _against(ok: pd.DataFrame, key: str, sweep: SweepData) -> Figure:
    others = [p for p in sweep.varied if p != key]
    values = list(dict.fromkeys(ok[key].tolist()))
    numeric = all(_is_number(v) and math.isfinite(v) for v in values)
    if numeric:
        values.sort()
    position = {str(v): float(v) if numeric else float(i) for i, v in enumerate(values)}
    fig, axes = new_figure(1, len(SWEEP_METRICS), size=(12.0, 4.5))
    if others:
        labels = (
            ok[others]
            .astype(str)
            .agg(lambda r: ", ".join(f"{k}={v}" for k, v in r.items()), axis=1)
        )
    else:
        labels = pd.Series("all configurations", index=ok.index)
    for ax, (column, ylabel, scale, _) in zip(axes, SWEEP_METRICS, strict=True):
        series = list(dict.fromkeys(labels))
        for i, label in enumerate(series):
            rows = ok[labels == label]
            x = np.array([position[str(v)] for v in rows[key]])
            if not numeric:  # side by side within a category, so equal series stay visible
                x = x + (i - (len(series) - 1) / 2) * min(0.08, 0.6 / len(series))
            if column in rows:
                y = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float) * scale
            else:
                y = np.full(len(rows), math.nan)
            order = np.argsort(x, kind="stable")
            ax.plot(
                x[order],
                y[order],
                marker=_MARKERS[i % len(_MARKERS)],
                markersize=max(4.0, 8.0 - i),
                ls=_STYLES[i % len(_STYLES)] if numeric else "none",
                label=label,
            )
        ax.set_xlabel(key)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1e-12) * 1.08)  # no marker on the frame
        if not numeric or len(position) <= 12:
            ax.set_xticks(list(position.values()), list(position))
        if not numeric:
            ax.set_xlim(-0.5, len(position) - 0.5)
        ax.set_title(ylabel.split(" (")[0])
    handles, names = axes[0].get_legend_handles_labels()
    if others:
        fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 4))
    fig.suptitle(
        f"{sweep.folder.name}: TTFT p99, hit ratio and cost against {key} "
        f"({len(ok)} configurations)"
    )
    return fig

"""One look for every report figure: its size, fonts and resolution, so each is legible as saved.

Figures are `matplotlib.figure.Figure` objects made without pyplot: no global figure list to
leak, no backend switched under a notebook; PNGs are rendered by Agg.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from kvsim.hardware.tier_kinds import TIER_KINDS

#: Saved size in inches and resolution: 8 x 4.5 in at 130 dpi is 1040 x 585 pixels.
SIZE_IN = (8.0, 4.5)
DPI = 130
#: Font sizes in points, none below 9 at the saved size.
_RC = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "figure.titlesize": 12,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
#: One colour per tier, in the hierarchy's order, the same in every figure.
TIER_COLORS = {
    **{kind.name: kind.colour for kind in TIER_KINDS},
    "gpu": "#7f7f7f",
    "pd_nvlink": "#17becf",
    "fabric": "#bcbd22",
}


def tier_color(name: str) -> str:
    return TIER_COLORS.get(name, "#333333")


@contextmanager
def styled() -> Iterator[None]:
    """Build figures inside this: text takes its size from rcParams when it is created."""
    with matplotlib.rc_context(_RC):
        yield


def new_figure(
    nrows: int = 1, ncols: int = 1, size: tuple[float, float] = SIZE_IN, **kwargs: Any
) -> tuple[Figure, Any]:
    """A figure with a constrained layout and its axes (an array when there are several)."""
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=True, **kwargs)
    return fig, axes


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG at the report's resolution."""
    buf = io.BytesIO()
    with styled():
        fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()

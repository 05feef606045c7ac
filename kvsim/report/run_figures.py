"""The figures of one run, drawn from its requests and timeline Parquet and its summary.

`run_figures` returns them by name, in the order the report shows them; `per_replica` only for
cluster runs: a bar per replica up to `PER_REPLICA_BARS` replicas, beyond that the spread across
replicas (each figure sorted, with its percentiles), which reads the same at 50 replicas or
5,000 and costs a few lines instead of thousands of labelled bars. Every figure says what it
shows in its title and puts units on its axes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kvsim.report.data import RunData
from kvsim.report.style import new_figure, styled, tier_color
from kvsim.units import format_bytes

#: Bins of the throughput-over-time curve.
THROUGHPUT_BINS = 100
#: The most replicas drawn as one bar each; a larger fleet gets the spread across replicas.
PER_REPLICA_BARS = 32
_ATTRIBUTION = (  # (summary key, label, colour): captured first, then what was lost, and to what
    ("captured", "captured", "#2ca02c"),
    ("lost_to_routing", "lost to routing", "#ff7f0e"),
    ("lost_to_staleness", "lost to stale router state", "#9467bd"),
    ("lost_to_eviction", "lost to eviction", "#d62728"),
)


def run_figures(run: RunData) -> dict[str, Figure]:
    """Every figure of `run`, by name (the PNG's stem in the report)."""
    with styled():
        out = {
            "latency_cdf": latency_cdf(run),
            "throughput_queue": throughput_queue(run),
            "tier_occupancy": tier_occupancy(run),
            "link_bytes": link_bytes(run),
            "hit_ratio": hit_ratio(run),
            "cost": cost_breakdown(run),
        }
        if run.cluster:
            out["per_replica"] = per_replica(run)
    return out


# -- helpers ---------------------------------------------------------------------------------------
def run_label(summary: dict[str, Any]) -> str:
    """'mooncake-conversation, llama-3.1-8b on h100-sxm, lru, 2 replicas (dynamo-kv)'."""
    parts = [str(summary.get("trace")), f"{summary.get('model')} on {summary.get('hardware')}"]
    parts.append(str(summary.get("policy")))
    if summary.get("replicas"):
        parts.append(f"{summary['replicas']} replicas ({summary.get('router')})")
    return ", ".join(parts)


def _column(run: RunData, table: str, name: str) -> np.ndarray:
    t = run.requests if table == "requests" else run.timeline
    return t.column(name).to_numpy(zero_copy_only=False).astype(float)


def _number(value: object) -> float:
    """A summary figure as a float; None (JSON's NaN) as NaN."""
    return float(value) if isinstance(value, int | float) else math.nan


def _note(ax: Axes, text: str) -> None:
    """Say in the panel why it is empty, rather than leave blank axes."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555555")


def _label_bars(ax: Axes, bars: Any, labels: list[str]) -> None:
    """Write each bar's value on it; call `_headroom` once every bar is drawn."""
    ax.bar_label(bars, labels=labels, padding=3, fontsize=9)


def _headroom(ax: Axes, horizontal: bool = False, factor: float = 1.18) -> None:
    """Room beyond the longest bar for its label."""
    if horizontal:
        ax.set_xlim(0, max(ax.get_xlim()[1], 1e-12) * factor)
    else:
        ax.set_ylim(0, max(ax.get_ylim()[1], 1e-12) * factor)


def _legend_above(ax: Axes, ncols: int) -> None:
    """A legend between the panel's title and its plot, where it hides no bar."""
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=ncols, frameon=False)


def _title(fig: Figure, what: str, summary: dict[str, Any]) -> None:
    """What the figure shows, and under it which run."""
    fig.suptitle(f"{what}\n{run_label(summary)}")


# -- latency ---------------------------------------------------------------------------------------
def latency_cdf(run: RunData) -> Figure:
    """TTFT and TPOT CDFs of completed requests, with their p50 and p99 marked."""
    fig, (left, right) = new_figure(1, 2)
    for ax, name, what in ((left, "ttft_s", "TTFT"), (right, "tpot_s", "TPOT")):
        values = _column(run, "requests", name)
        ms = np.sort(values[np.isfinite(values)]) * 1000
        ax.set_xlabel(f"{what} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{what} CDF ({len(ms):,} requests)")
        if not len(ms):
            _note(ax, f"no request has a {what}")
            continue
        ax.step(ms, np.arange(1, len(ms) + 1) / len(ms), where="post", color="#1f77b4")
        for q, style in ((50, "--"), (99, ":")):
            v = float(np.percentile(ms, q))
            ax.axvline(v, color="#555555", ls=style, lw=1, label=f"p{q} {v:,.1f} ms")
        if ms[0] > 0 and ms[-1] / ms[0] > 30:
            ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.legend(loc="best")  # where it hides the least of the curve
    _title(fig, "Latency of completed requests", run.summary)
    return fig


# -- throughput and queues -------------------------------------------------------------------------
def output_rate(
    first: np.ndarray, finish: np.ndarray, output: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Output tokens per second in each bin between `edges`: a request's first token at its
    first-token time, the rest spread evenly until it finished (decode steps are regular)."""
    ok = np.isfinite(first) & np.isfinite(finish) & (output > 0)
    first, finish, output = first[ok], finish[ok], output[ok]
    tokens = np.histogram(first, edges)[0].astype(float)  # one first token each
    rest = output - 1
    span = finish - first
    ramp = (span > 0) & (rest > 0)
    instant = ~ramp & (rest > 0)
    tokens += np.histogram(finish[instant], edges, weights=rest[instant])[0]
    if ramp.any():
        slope = rest[ramp] / span[ramp]
        times = np.concatenate([first[ramp], finish[ramp]])
        order = np.argsort(times, kind="stable")
        times = times[order]
        rate = np.cumsum(np.concatenate([slope, -slope])[order])
        # tokens generated by each event time: the integral of the piecewise-constant rate
        done = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(times))])
        tokens += np.diff(np.interp(edges, times, done))
    return tokens / np.diff(edges)


def throughput_queue(run: RunData) -> Figure:
    """Output throughput and the queues (waiting, running, loading) over simulated time."""
    fig, (top, bottom) = new_figure(2, 1, sharex=True)
    end = max(_number(run.summary.get("simulated_s")), 1e-9)
    edges = np.linspace(0.0, end, THROUGHPUT_BINS + 1)
    rate = output_rate(
        _column(run, "requests", "first_token_s"),
        _column(run, "requests", "finish_s"),
        _column(run, "requests", "output_tokens"),
        edges,
    )
    top.stairs(rate, edges, color="#1f77b4", fill=True, alpha=0.6)
    mean = _number(run.summary.get("throughput_tokens_per_s"))
    top.axhline(mean, color="#555555", ls="--", lw=1, label=f"mean {mean:,.0f} tokens/s")
    top.set_ylabel("output tokens/s")
    top.set_title(f"Output throughput (bins of {end / THROUGHPUT_BINS:,.2g} s)")
    top.legend(loc="upper right")
    time_s = _column(run, "timeline", "time_s")
    for name, color in (("waiting", "#d62728"), ("running", "#2ca02c"), ("loading", "#ff7f0e")):
        bottom.step(time_s, _column(run, "timeline", name), where="post", label=name, color=color)
    bottom.set_ylabel("requests")
    bottom.set_xlabel("simulated time (s)")
    bottom.set_title("Requests waiting, running and loading KV from lower tiers")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper right", ncols=3)
    _title(fig, "Throughput and queues over time", run.summary)
    return fig


# -- tiers -----------------------------------------------------------------------------------------
def tier_occupancy(run: RunData) -> Figure:
    """HBM (pinned and cached) and each lower tier's resident blocks, as % of capacity."""
    fig, (left, right) = new_figure(1, 2, sharex=True)
    time_s = _column(run, "timeline", "time_s")
    summary = run.summary
    hbm = int(summary.get("kv_blocks") or 0) * int(summary.get("replicas") or 1)
    if hbm > 0:
        for name, label, style in (
            ("hbm_cached_blocks", "cached (holding a prefix)", "-"),
            ("hbm_used_blocks", "in use by running requests", "--"),
        ):
            share = _column(run, "timeline", name) / hbm * 100
            left.step(time_s, share, where="post", ls=style, color=tier_color("hbm"), label=label)
        left.legend(loc="lower right")
    left.set_title(f"HBM ({hbm:,} blocks)")
    left.set_ylim(0, 105)
    left.set_ylabel("occupancy (% of capacity)")
    left.set_xlabel("simulated time (s)")
    tiers = summary.get("tiers") or {}
    styles = ("-", "--", "-.", ":")
    for k, (name, stats) in enumerate(tiers.items()):
        capacity = int(stats.get("capacity_blocks") or 0)
        column = f"{name}_blocks"
        if capacity <= 0 or column not in run.timeline.column_names:
            continue
        share = _column(run, "timeline", column) / capacity * 100
        right.step(time_s, share, where="post", color=tier_color(name), ls=styles[k % 4],
                   lw=2.6 - 0.4 * k, label=f"{name} ({capacity:,} blocks)")  # fmt: skip
    if tiers:
        right.set_ylim(0, 105)
        right.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), title="capacity")
    else:
        _note(right, "HBM only: no lower tiers in this run")
    right.set_title("Lower tiers")
    right.set_ylabel("occupancy (% of capacity)")
    right.set_xlabel("simulated time (s)")
    _title(fig, "KV blocks resident per tier over time", summary)
    return fig


def link_bytes(run: RunData) -> Figure:
    """Bytes each tier's link moved: read up into HBM and written down from it."""
    fig, ax = new_figure()
    links = run.summary.get("links") or {}
    names = list(links)
    x = np.arange(len(names))
    width = 0.38
    for offset, key, label, color in (
        (-width / 2, "bytes_read", "read (tier → HBM)", "#1f77b4"),
        (width / 2, "bytes_written", "written (HBM → tier)", "#ff7f0e"),
    ):
        values = np.array([_number(links[n].get(key)) for n in names])
        bars = ax.bar(x + offset, values / 2**30, width, label=label, color=color)
        _label_bars(ax, bars, [format_bytes(v) if v else "0" for v in values])
    _headroom(ax)
    ax.set_xticks(x, names)
    ax.set_xlabel("link (named by the tier it connects, or the P/D hand-off path)")
    ax.set_ylabel("bytes moved (GiB)")
    if not names:
        _note(ax, "HBM only: no links")
    elif not any(_number(links[n].get(k)) for n in names for k in ("bytes_read", "bytes_written")):
        _note(ax, "no bytes moved on any link")
    else:
        _legend_above(ax, 2)
    _title(fig, "Bytes moved per link over the run", run.summary)
    return fig


# -- hits ------------------------------------------------------------------------------------------
def hit_ratio(run: RunData) -> Figure:
    """Share of input tokens served by each tier, and the reuse ceiling split into what was
    captured and what routing, eviction and stale router state lost."""
    fig, (left, right) = new_figure(1, 2, width_ratios=[1.2, 1])
    summary = run.summary
    by_tier = summary.get("hit_ratio_by_tier") or {}
    names = list(by_tier)
    values = [_number(by_tier[n]) * 100 for n in names]
    bars = left.bar(names, values, color=[tier_color(n) for n in names])
    _label_bars(left, bars, [f"{v:.1f}%" for v in values])
    total = _number(summary.get("prefix_hit_ratio")) * 100
    left.set_title(f"Hit ratio per tier (total {total:.1f}%)")
    left.set_xlabel("tier the reused tokens came from")
    left.set_ylabel("% of input tokens")
    _headroom(left)
    shares = summary.get("hit_attribution")
    right.set_xlabel("% of input tokens")
    if not shares:
        _note(right, "no hit attribution in this run")
        right.set_yticks([])
    else:
        start = 0.0
        for key, label, color in _ATTRIBUTION:
            v = _number(shares.get(key)) * 100
            right.barh([0], [v], 0.8, left=start, color=color, label=f"{label} {v:.1f}%")
            start += v
        ceiling = _number(shares.get("ceiling")) * 100
        right.axvline(ceiling, color="black", lw=1.5, label=f"ceiling {ceiling:.1f}%")
        right.set_yticks([])
        right.set_ylim(-0.6, 2.6)
        right.set_xlim(0, max(ceiling, 1e-6) * 1.08)
        right.legend(loc="upper left", ncols=1)
    right.set_title("Reuse ceiling: captured and lost")
    _title(fig, "Prefix-cache hits: where reused tokens came from, and what was lost", summary)
    return fig


# -- cost ------------------------------------------------------------------------------------------
def cost_breakdown(run: RunData) -> Figure:
    """What the run cost: the GPUs and each tier's share, priced per hour by the profile."""
    fig, ax = new_figure()
    summary = run.summary
    hours = _number(summary.get("simulated_s")) / 3600
    hourly = summary.get("hourly_cost_usd") or {}
    names = list(hourly)
    usd = np.array([_number(hourly[n]) * hours for n in names])
    total = float(usd.sum())
    y = np.arange(len(names))
    bars = ax.barh(y, usd, color=[tier_color(n) for n in names])
    labels = [f"{v:,.3g} USD ({_share(v, total)})" for v in usd]
    _label_bars(ax, bars, labels)
    _headroom(ax, horizontal=True, factor=1.3)
    ax.set_yticks(y, [("GPUs" if n == "gpu" else n) for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("USD over the simulated run")
    ax.set_ylabel("component")
    per_m = _number(summary.get("cost_per_million_tokens_usd"))
    sim_s = _number(summary.get("simulated_s"))
    what = (
        f"Cost breakdown: {total:,.3g} USD for {sim_s:,.0f} simulated s "
        f"= {per_m:,.3g} USD per million tokens"
    )
    _title(fig, what, summary)
    return fig


def _share(part: float, total: float) -> str:
    if not total:
        return "0%"
    share = part / total
    return "<0.1%" if 0 < share < 0.001 else f"{share:.1%}"


# -- replicas --------------------------------------------------------------------------------------
def per_replica(run: RunData) -> Figure:
    """Each replica's load: requests routed and completed, busy time, hit ratio, TTFT (the
    spread across replicas beyond `PER_REPLICA_BARS` of them)."""
    rows = run.summary.get("per_replica") or []
    if len(rows) > PER_REPLICA_BARS:
        return replica_spread(run)
    fig, axes = new_figure(2, 2, size=(10.0, 6.5))
    names = [
        f"r{r['replica']}" + (f"\n{r['role']}" if r.get("role") not in (None, "mixed") else "")
        for r in rows
    ]
    x = np.arange(len(rows))
    width = 0.38
    ax = axes[0, 0]
    for offset, key, color in (
        (-width / 2, "requests", "#1f77b4"),
        (width / 2, "completed", "#2ca02c"),
    ):
        values = [int(r.get(key) or 0) for r in rows]
        _label_bars(
            ax,
            ax.bar(x + offset, values, width, color=color, label=key),
            [f"{v:,}" for v in values],
        )
    ax.set_title("Requests routed and completed")
    ax.set_ylabel("requests")
    _headroom(ax, factor=1.35)
    ax.legend(loc="upper left", ncols=2)
    ax = axes[0, 1]
    busy = [_number(r.get("busy_fraction")) * 100 for r in rows]
    _label_bars(ax, ax.bar(x, busy, color="#7f7f7f"), [f"{v:.0f}%" for v in busy])
    ax.set_title("Busy time")
    ax.set_ylabel("% of simulated time")
    ax.set_ylim(0, 115)
    ax = axes[1, 0]
    hits = [_number(r.get("prefix_hit_ratio")) * 100 for r in rows]
    _label_bars(ax, ax.bar(x, hits, color=tier_color("hbm")), [f"{v:.1f}%" for v in hits])
    ax.set_title("Prefix hit ratio")
    ax.set_ylabel("% of input tokens")
    _headroom(ax)
    ax = axes[1, 1]
    for offset, key, label, color in (
        (-width / 2, "ttft_p50_s", "p50", "#1f77b4"),
        (width / 2, "ttft_p99_s", "p99", "#d62728"),
    ):
        values = [_number(r.get(key)) * 1000 for r in rows]
        bars = ax.bar(x + offset, np.nan_to_num(values), width, color=color, label=label)
        _label_bars(ax, bars, ["-" if math.isnan(v) else f"{v:,.0f}" for v in values])
    ax.set_title("TTFT p50 and p99")
    ax.set_ylabel("TTFT (ms)")
    _headroom(ax, factor=1.35)
    ax.legend(loc="upper left", ncols=2)
    for ax in axes.flat:
        ax.set_xticks(x, names)
        ax.set_xlabel("replica")
    _title(fig, "Load per replica", run.summary)
    return fig


#: The panels of the spread across replicas: (title, y label, [(key, label, scale, colour)]).
_SPREAD_PANELS = (
    ("Requests routed and completed", "requests",
     [("requests", "routed", 1.0, "#1f77b4"), ("completed", "completed", 1.0, "#2ca02c")]),
    ("Busy time", "% of simulated time", [("busy_fraction", "busy", 100.0, "#7f7f7f")]),
    ("Prefix hit ratio", "% of input tokens",
     [("prefix_hit_ratio", "hit ratio", 100.0, tier_color("hbm"))]),
    ("TTFT p50 and p99", "TTFT (ms)",
     [("ttft_p50_s", "TTFT p50", 1000.0, "#1f77b4"),
      ("ttft_p99_s", "TTFT p99", 1000.0, "#d62728")]),
)  # fmt: skip


def replica_spread(run: RunData) -> Figure:
    """A fleet's load as the spread across its replicas: each figure's values sorted, so the
    curve's left end is the least loaded replica, its middle the median, its right end the most
    loaded; the legend gives the median, p99 and maximum across replicas. P/D roles get a
    curve each."""
    rows = run.summary.get("per_replica") or []
    roles = list(dict.fromkeys(str(r.get("role") or "mixed") for r in rows))
    fig, axes = new_figure(2, 2, size=(10.0, 6.5))
    styles = ("-", "--", "-.", ":")
    for ax, (title, ylabel, series) in zip(axes.flat, _SPREAD_PANELS, strict=True):
        for k, role in enumerate(roles):
            group = [r for r in rows if str(r.get("role") or "mixed") == role]
            for key, label, scale, color in series:
                values = np.sort(np.array([_number(r.get(key)) for r in group]) * scale)
                values = values[~np.isnan(values)]  # a replica that served nothing has no TTFT
                if not len(values):
                    continue
                share = (np.arange(len(values)) + 0.5) / len(values) * 100
                p50, p99 = np.percentile(values, [50, 99])
                name = label if len(roles) == 1 else f"{role}: {label}"
                name += f": median {_short(p50)}, p99 {_short(p99)}, max {_short(values[-1])}"
                if len(values) < len(rows):
                    name += f" (the {len(values):,} with a value)"
                ax.plot(share, values, color=color, ls=styles[k % len(styles)], lw=1.6, label=name)
        if ax.lines:
            ax.legend(loc="upper left", fontsize=9)
            _headroom(ax, factor=1.35)
        else:
            _note(ax, "no values recorded")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xlim(0, 100)
        ax.set_xlabel("replicas, sorted by value (%)")
    _title(fig, f"Load per replica: the spread across {len(rows):,} replicas", run.summary)
    return fig


def _short(value: float) -> str:
    """A figure in a legend: '2,300' or '0.0312', never '2.3e+03'."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"

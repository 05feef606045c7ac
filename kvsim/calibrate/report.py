"""The calibration report: Markdown with the validation figures, and PNG plots of each kernel
family (measured points, the fitted interpolation, the roofline, held-out points)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from kvsim.calibrate.run import Calibration
from kvsim.costmodel import MeasuredCostModel, TransferModel
from kvsim.hardware.attention_pairs import causal_pairs as _pairs
from kvsim.models import ModelSpec


def _axes(title: str, xlabel: str):
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("seconds per call")
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


def _curve_plot(path: Path, title: str, xlabel: str, x, t, curve, held=()) -> None:
    """Measured points, the fitted curve a decade beyond them, and the roofline."""
    x = np.asarray(x, dtype=float)
    grid = np.geomspace(max(x[0] / 10, 1.0), x[-1] * 10, 200)
    fig, ax = _axes(title, xlabel)
    ax.plot(grid, curve.roofline(grid), "--", color="grey", label="roofline")
    ax.plot(grid, curve(grid), "-", color="tab:blue", label="fitted")
    ax.plot(x, t, "o", color="tab:blue", label="measured (fit)")
    if held:
        hx, ht = zip(*held, strict=True)
        ax.plot(hx, ht, "x", color="tab:red", markersize=8, label="measured (held out)")
    ax.axvspan(x[0], x[-1], color="tab:blue", alpha=0.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(c: Calibration, model: ModelSpec, folder: Path) -> list[Path]:
    """One PNG per kernel family (GEMMs share one), plus the forward-pass comparison."""
    folder.mkdir(parents=True, exist_ok=True)
    m = c.measured
    cost = MeasuredCostModel(
        model, c.profile, tp=m["tp"], kv_dtype=m["kv_dtype"], weight_dtype=m["dtype"]
    )
    paths = []
    fig, ax = _axes(f"GEMMs ({model.name}, per call)", "rows (tokens or sequences)")
    for (_, _, curve), (name, g) in zip(cost.gemm, m["gemm"].items(), strict=True):
        grid = np.geomspace(1, g["tokens"][-1] * 10, 200)
        (line,) = ax.plot(grid, curve(grid), "-", label=f"{name} {g['k']}x{g['n']}")
        ax.plot(grid, curve.roofline(grid), ":", color=line.get_color())
        ax.plot(g["tokens"], g["seconds"], "o", color=line.get_color())
    for label, t, _ in c.held_out.get("gemm", []):
        rows = int(label.rsplit("=", 1)[1])
        ax.plot(rows, t, "x", color="tab:red")
    ax.legend(fontsize=7, title="fitted (-), roofline (:), held out (x)", title_fontsize=7)
    fig.tight_layout()
    paths.append(folder / "gemm.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    ew = m["elementwise"]
    held = [(int(lbl[2:]), t) for lbl, t, _ in c.held_out.get("elementwise", [])]
    paths.append(folder / "elementwise.png")
    _curve_plot(
        paths[-1],
        "Norms, RoPE, SiLU, adds (one layer)",
        "tokens",
        ew["tokens"],
        ew["seconds"],
        cost.elementwise,
        held,
    )

    for key, curve, family in (
        ("prefill_attention", cost.prefill, "prefill attention"),
        ("prefill_attention_cached", cost.prefill_cached, "prefill attention (cached prefix)"),
    ):
        doc = m[key]
        x = [_pairs(n, ctx) for n, ctx in zip(doc["tokens"], doc["context"], strict=True)]
        held = []
        for lbl, t, _ in c.held_out.get(family, []):
            parts = dict(p.split("=") for p in lbl.split())
            held.append((_pairs(int(parts["new"]), int(parts.get("ctx", 0))), t))
        paths.append(folder / f"{key}.png")
        _curve_plot(
            paths[-1],
            f"{family.capitalize()} (one layer)",
            "(query, key) pairs",
            x,
            doc["seconds"],
            curve,
            held,
        )

    d = m["decode_attention"]
    fig, ax = _axes("Decode attention (one layer), by batch", "context tokens")
    grid = np.geomspace(max(d["context"][0] / 10, 1), d["context"][-1] * 10, 200)
    for b, row in zip(d["batch"], d["seconds"], strict=True):
        (line,) = ax.plot(grid, cost.decode(b, grid), "-", label=f"B={b}")
        ax.plot(
            grid, cost.decode.roofline(np.full_like(grid, b), grid), ":", color=line.get_color()
        )
        ax.plot(d["context"], row, "o", color=line.get_color())
    for lbl, t, _ in c.held_out.get("decode attention", []):
        ax.plot(int(lbl.split()[1][2:]), t, "x", color="tab:red")
    ax.legend(fontsize=7, title="fitted (-), roofline (:), held out (x)", title_fontsize=7)
    fig.tight_layout()
    paths.append(folder / "decode_attention.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    transfer = TransferModel(c.profile)
    for direction in ("h2d", "d2h"):
        doc = m["copy"][direction]
        held = [(int(lbl.split()[0]), t) for lbl, t, _ in c.held_out.get(f"copy {direction}", [])]
        paths.append(folder / f"copy_{direction}.png")
        _curve_plot(
            paths[-1],
            f"Copy {direction} (pinned: {doc['pinned']})",
            "bytes",
            doc["bytes"],
            doc["seconds"],
            transfer.curves[direction],
            held,
        )
    if "nvme_read" in transfer.curves:
        st = m["storage"]
        paths.append(folder / "storage.png")
        _curve_plot(
            paths[-1],
            f"Storage reads ({st['path']}, {st['method']})",
            "bytes",
            st["bytes"],
            st["seconds"],
            transfer.curves["nvme_read"],
        )

    if c.forward:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        names = [r["name"] for r in c.forward]
        y = np.arange(len(names))
        ax.barh(y - 0.25, [r["measured_s"] * 1e3 for r in c.forward], 0.25, label="measured")
        ax.barh(y, [r["predicted_s"] * 1e3 for r in c.forward], 0.25, label="kvsim (measured)")
        ax.barh(y + 0.25, [r["roofline_s"] * 1e3 for r in c.forward], 0.25, label="roofline")
        ax.set_yticks(y, names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("iteration time (ms)")
        ax.set_title("Forward pass: measured vs predicted", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(folder / "forward.png")
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def report_markdown(c: Calibration, model: ModelSpec, plots: list[Path], base: Path) -> str:
    """The report text; ``plots`` are linked relative to ``base`` (the report's folder)."""
    m = c.measured
    kind = "CPU" if m["device_kind"] == "cpu" else "GPU"
    lines = [
        f"# Calibration report: {c.profile.name}",
        "",
        f"- device: {m['device']} ({kind}); driver: {m['driver']}; torch {m['torch']}",
        f"- date: {m['date']}; model: {m['model']} at tp={m['tp']}, {m['dtype']} weights and KV",
        f"- plan: {'quick' if m.get('quick') else 'full'}, {m.get('threads', '?')} CPU threads, "
        f"{m['warmup']} warm-up and at least {m['repetitions']} timed calls per point in "
        f"{m.get('rounds', 1)} interleaved rounds, medians; "
        "spread = interquartile range / median",
        f"- timed shapes: {c.shapes}" if c.shapes else "- timed shapes: the model's",
        f"- fitted per-iteration overhead: {m['overhead_s'] * 1e6:.1f} µs",
        f"- storage: {c.storage_note}",
        "",
        "## Held-out shapes (measured, not used for fitting)",
        "",
        *(
            ["Timed on the shapes above and scaled to the model's as the tables are.", ""]
            if any("scale" in g for g in m["gemm"].values()) or "scale" in m["elementwise"]
            else []
        ),
        "| kernel family | points | median error | worst error |",
        "|---|---|---|---|",
    ]
    for family, (median, worst) in c.held_out_errors().items():
        lines.append(f"| {family} | {len(c.held_out[family])} | {_pct(median)} | {_pct(worst)} |")
    lines += ["", "## End to end: one forward pass of a random-weight decoder", ""]
    if c.forward:
        med, worst = c.forward_errors() or (0.0, 0.0)
        layers = c.forward[0].get("layers")
        if layers:
            lines += [
                f"{layers} layers of the timed shapes, predicted from their own tables "
                "(before scaling to the model's).",
                "",
            ]
        lines += [
            f"Median absolute error **{_pct(med)}**, worst **{_pct(worst)}** "
            "(target: median < 10%, worst < 25%).",
            "",
            "| batch | kind | tokens | measured | spread | kvsim (measured tables) | error "
            "| roofline | roofline error |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in c.forward:
            err = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
            rerr = (r["roofline_s"] - r["measured_s"]) / r["measured_s"]
            lines.append(
                f"| {r['batch']} | {r['kind']} | {r['tokens']} | {r['measured_s'] * 1e3:.3f} ms "
                f"| {_pct(r.get('spread', 0.0))} | {r['predicted_s'] * 1e3:.3f} ms "
                f"| {100 * err:+.1f}% "
                f"| {r['roofline_s'] * 1e3:.3f} ms | {100 * rerr:+.1f}% |"
            )
    lines += [f"- {n}" for n in c.notes]
    lines += ["", "## Plots", ""]
    for p in plots:
        rel = p.relative_to(base) if p.is_relative_to(base) else p
        lines.append(f"![{p.stem}]({rel.as_posix()})")
    lines += [
        "",
        "Fitted: log(time) interpolated linearly in log(size) between measured points; beyond "
        "them the measured/roofline ratio fades to 1 over one decade. Roofline: the profile's "
        + ("datasheet peaks x efficiencies." if kind == "GPU" else "best measured rates (CPU)."),
    ]
    return "\n".join(lines) + "\n"


def write_report(c: Calibration, model: ModelSpec, out: Path) -> dict[str, Any]:
    """Write ``NAME.report.md`` and ``NAME.report/*.png`` beside the profile ``out``."""
    folder = out.with_suffix(".report")
    plots = write_plots(c, model, folder)
    md = out.with_suffix(".report.md")
    md.write_text(report_markdown(c, model, plots, out.parent), encoding="utf-8")
    return {"report": md, "plots": plots}

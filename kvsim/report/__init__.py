"""Figures and a report page from a run's or a sweep's results (`kvsim report`).

    from kvsim import report
    figs = report.figures("runs/lru")          # {"latency_cdf": Figure, ...}
    report.write_report("runs/lru")            # runs/lru/report/report.md and its PNGs
    report.write_report("runs/lru", "out", html=True)   # out/report.html, images embedded

A run's figures: latency_cdf, throughput_queue, tier_occupancy, link_bytes, hit_ratio, cost,
and for cluster runs per_replica. A sweep's: one ``vary_<key>`` per varied key. A folder
missing a file is one `ReportError` line naming it, and nothing is written.
"""

from kvsim.report.data import ReportError, RunData, SweepData, is_sweep, load_run, load_sweep
from kvsim.report.page import figures, write_report
from kvsim.report.run_figures import run_figures
from kvsim.report.sweep_figures import sweep_figures

__all__ = [
    "ReportError",
    "RunData",
    "SweepData",
    "figures",
    "is_sweep",
    "load_run",
    "load_sweep",
    "run_figures",
    "sweep_figures",
    "write_report",
]

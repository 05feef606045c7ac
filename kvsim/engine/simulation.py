"""A run of the engine: resolve the settings, assemble the fleet, replay the trace, collect.

`simulate` is the engine's whole API: a trace, a model, a hardware profile and an engine config
in, a `RunResult` out. `run_engine` does the same for settings `kvsim.resolve` has already
checked (`kvsim.run` resolves a whole run once and calls it).
"""

from __future__ import annotations

import math
import time

import numpy as np
import simpy

from kvsim.engine.assemble import RunParts, assemble
from kvsim.engine.collect import collect
from kvsim.engine.config import EngineConfig
from kvsim.engine.resolve import ResolvedEngine, resolve_engine
from kvsim.engine.trace_view import TraceRequests
from kvsim.engine.warmup import horizon_blocks, replay_horizon, warm_up
from kvsim.engine.window import Window, WindowMeter, WindowResult
from kvsim.engine.workload import ProgressFn, Workload
from kvsim.hardware.profile import HardwareProfile
from kvsim.metrics.requests import RequestLog
from kvsim.metrics.result import RunResult
from kvsim.metrics.timeline import Timeline
from kvsim.models import ModelSpec
from kvsim.traces import Trace

__all__ = ["ProgressFn", "RunResult", "run_engine", "run_window", "simulate"]


def simulate(
    trace: Trace,
    model: ModelSpec,
    profile: HardwareProfile,
    config: EngineConfig,
    progress: ProgressFn | None = None,
) -> RunResult:
    """Resolve `config` for `model` on `profile` and replay `trace` through it (`run_engine`)."""
    return run_engine(trace, resolve_engine(config, model, profile), progress)


def run_engine(trace: Trace, run: ResolvedEngine, progress: ProgressFn | None = None) -> RunResult:
    """Replay `trace` through the run's replicas and return what they measured."""
    source = TraceRequests(trace, run.config.block_size)
    return run_window(source, run, Window(-math.inf, math.inf), progress).result


def run_window(
    source: TraceRequests, run: ResolvedEngine, window: Window, progress: ProgressFn | None = None
) -> WindowResult:
    """`run_engine` for one window of a sharded run (kvsim.engine.window), on the engine's view
    of the trace (a window drops the trace's table once the view is built): the trace ends at
    the window's end; the requests before its timed start warm the caches (kvsim.engine.warmup)
    and what it counts is cut to the window."""
    wall_start = time.perf_counter()
    env = simpy.Environment()
    lower_tiers = sum(1 for t in run.profile.tiers if t.name != "hbm" and t.enabled)
    arrival = source.arrival_s
    timed = None if window.whole else arrival >= window.timed_from_s
    log = RequestLog(source.n, lower_tiers)
    workload = Workload(env, source, run, log, progress, timed)
    fleet = assemble(RunParts.build(env, run, source), workload.finished)
    timeline = Timeline(
        env, fleet.replicas, run.config.timeline_interval_s, lambda: workload.completed
    )
    meter = WindowMeter(env, fleet, window)
    if timed is not None and not timed.all():
        warm = replay_horizon(source, np.flatnonzero(~timed), horizon_blocks(fleet))
        env.process(warm_up(env, workload, fleet, warm))
    workload.start(fleet, timeline, from_s=window.timed_from_s)
    env.run()
    result = collect(workload, fleet, timeline, time.perf_counter() - wall_start)
    if window.whole:
        first = float(np.min(arrival)) if source.n else 0.0
        return WindowResult(result, np.arange(source.n), first, first + result.simulated_s)
    return meter.restrict(result, arrival)

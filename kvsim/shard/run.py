"""`kvsim run --shards N`: one run split into consecutive time windows, simulated in parallel.

Each window (kvsim.shard.windows) runs in its own worker (a local process pool or Ray, the
executors `kvsim sweep` uses). The worker reads the part of the trace its window needs
(kvsim.shard.source): a canonical Parquet file is re-timed once by the caller, streamed into a
copy, and each worker reads only its slice's row groups; any other trace is loaded and
re-timed (kvsim.shard.retime) by the worker as by the caller. It replays the recent requests
before the window's timed start cache-only to rebuild every tier's contents
(kvsim.engine.warmup), runs the timed engine from ``--warmup`` seconds before the window (so
queues and batches form again), counts the requests that arrive in the window and follows them
until they finish (kvsim.engine.window). The windows' results are merged (kvsim.shard.merge)
into the files and summary keys of an unsharded run, with ``shards``, ``warmup_s``, per-window
wall, CPU and memory, and ``sharding`` (what was approximated) added. One shard is the
unsharded run, bit for bit.

What this approximates, and `benchmarks/bench_shards.py` measures: the requests before a window
reach the caches in arrival order, one at a time and in no time, so their effect on the caches
is exact only when requests do not overlap; queues, batches and in-flight transfers at the
window's start are rebuilt only by the warm-up's timed seconds (an overloaded fleet's queue is
not: docs/sharding.md); a closed-loop turn whose earlier turn fell before the timed start
arrives at its estimated time.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kvsim.config import RunConfig
from kvsim.engine.simulation import ProgressFn, run_window
from kvsim.engine.trace_view import TraceRequests
from kvsim.engine.window import Window, WindowResult
from kvsim.errors import ConfigError, KvsimError
from kvsim.resolve import ResolvedRun, resolve
from kvsim.shard.merge import merge
from kvsim.shard.retime import retimed
from kvsim.shard.source import (
    InMemory,
    Retimed,
    Rows,
    TraceFile,
    stream_retimed,
    streamable,
    window_trace,
)
from kvsim.shard.windows import check_sharding, windows
from kvsim.traces import Trace, load_trace

#: what the summary says of a sharded run
APPROXIMATION = (
    "approximate: the trace ran as {shards} time windows in parallel, each after a cache-only "
    "replay of the requests before it and {warmup_s:g} s of timed warm-up; a request counts in "
    "the window where it arrives (kvsim.shard; errors measured in docs/sharding.md)"
)


@dataclass(frozen=True)
class Sharding:
    """How a run is split: `shards` windows, `warmup_s` timed seconds before each, run by the
    `executor` ('local' processes or 'ray', at `ray_address`) on `jobs` workers (default: one
    per shard, at most one per CPU)."""

    shards: int = 1
    warmup_s: float = 0.0
    executor: str = "local"
    ray_address: str | None = None
    jobs: int | None = None


@dataclass(frozen=True)
class WindowTask:
    """One window to run; picklable, so it travels to a pool or Ray worker."""

    index: int
    config: RunConfig  # resolved
    window: Window
    file: TraceFile | None = None  # the re-timed trace file to read a slice of (None: load it)


@dataclass
class WindowOutcome:
    """What a worker sends back: the window's result or its one-line error, and measurements."""

    index: int
    result: WindowResult | None
    error: str | None
    run_s: float
    peak_rss_bytes: int | None
    worker: str
    cpu_s: float = math.nan  # the worker's CPU seconds: what a window costs on a busy machine


def run_window_task(task: WindowTask) -> WindowOutcome:
    """Run one window in this process; any exception becomes its one-line error."""
    from kvsim.sweep.worker import _reset_peak_rss, cached_trace, one_line, peak_rss_bytes

    _reset_peak_rss()
    start = time.perf_counter()
    cpu = time.process_time()
    result, error = None, None
    try:
        resolved = resolve(task.config)
        if task.file is not None:
            result = run_rows_window(resolved, task.file, task.window)
        else:
            trace = cached_trace(task.config)
            if not task.window.whole:  # as `ShardedRun.cut` cut it
                trace = retimed_trace(resolved, trace)
            result = run_resolved_window(resolved, trace, task.window)
    except KvsimError as exc:
        error = one_line(str(exc))
    except Exception as exc:  # a bug in kvsim or a plugin
        error = one_line(f"{type(exc).__name__}: {exc}")
    return WindowOutcome(
        task.index,
        result,
        error,
        time.perf_counter() - start,
        peak_rss_bytes(),
        f"{socket.gethostname()}:{os.getpid()}",
        time.process_time() - cpu,
    )


def _window_failed(task: WindowTask, message: str) -> WindowOutcome:
    return WindowOutcome(task.index, None, message, math.nan, None, "ray")


run_window_task.failed = _window_failed  # type: ignore[attr-defined]


def run_cost_model(resolved: ResolvedRun) -> tuple[Any, int]:
    """The run's cost model and prefill chunk, which re-time closed-loop turns."""
    from kvsim.costmodel import make_cost_model

    config = resolved.engine.config
    cost = make_cost_model(
        resolved.model,
        resolved.profile,
        tp=config.tp,
        kv_dtype=config.kv_dtype,
        weight_dtype=config.weight_dtype,
        engine=resolved.engine.engine,
    )
    return cost, config.max_num_batched_tokens


def retimed_trace(resolved: ResolvedRun, trace: Trace) -> Trace:
    """`trace` with closed-loop turns re-timed by this run's cost model (kvsim.shard.retime);
    a worker re-times the trace it loads just as the caller did, so both cut it alike."""
    return retimed(trace, *run_cost_model(resolved))


def run_resolved_window(
    resolved: ResolvedRun, trace: Trace, window: Window, progress: ProgressFn | None = None
) -> WindowResult:
    """One window of `trace` under a resolved config (in this process); a whole window reads
    the whole trace, as it is."""
    return run_rows_window(resolved, InMemory(trace), window, progress)


def run_rows_window(
    resolved: ResolvedRun, rows: Rows, window: Window, progress: ProgressFn | None = None
) -> WindowResult:
    """One window, on the slice of `rows` it needs (kvsim.shard.source.window_trace); its
    result's rows are the whole trace's. The slice's table is dropped once the engine's view
    of it is built, and Arrow's pool, which keeps freed pages for its own reuse while the run
    allocates little through Arrow, gives back that table and the read's scratch (the midday
    window of docs/sharding.md's day: 0.8 GiB)."""
    trace, where = window_trace(rows, window, resolved.engine)
    source = TraceRequests(trace, resolved.engine.config.block_size)
    del trace  # the view keeps the columns it reads
    pa.default_memory_pool().release_unused()
    part = run_window(source, resolved.engine, window, progress)
    part.rows = where[part.rows]
    return part


def unshardable(resolved: ResolvedRun) -> str | None:
    """Why this run cannot be split into windows, or None."""
    engine = resolved.engine
    if engine.pd_split is not None:
        return (
            "prefill/decode disaggregation (--pd) cannot be sharded yet (the cache-only "
            "warm-up has no hand-off); run it unsharded"
        )
    if not engine.compression.identity:
        return (
            "runs with KV compression cannot be sharded yet (the cache-only warm-up does not "
            "compact KV as decoding does); run it unsharded or with --compression none"
        )
    return None


def check_shardable(resolved: ResolvedRun, sharding: Sharding) -> None:
    """Sharding's own settings, and the runs it cannot split (one line, before anything runs)."""
    check_sharding(sharding.shards, sharding.warmup_s)
    why = unshardable(resolved) if sharding.shards > 1 else None
    if why is not None:
        raise ConfigError(f"--shards: {why}")


@dataclass
class ShardedRun:
    """One run cut into windows: the tasks to hand to workers, and how their outcomes merge.
    `trace` is the loaded trace (re-timed when sharded), or a trace file's `Retimed` copy,
    which windows read in slices; either says what the summary says of the trace."""

    resolved: ResolvedRun
    sharding: Sharding
    trace: Trace | Retimed
    windows: list[Window]
    owns_copy: bool = True  # a re-timed copy is removed by `close`

    @classmethod
    def cut(cls, resolved: ResolvedRun, sharding: Sharding, trace: Trace) -> ShardedRun:
        """Windows over a loaded trace."""
        check_shardable(resolved, sharding)
        if sharding.shards > 1:
            trace = retimed_trace(resolved, trace)
        arrival = trace.table.column("arrival_s").to_numpy()
        cut = windows(arrival, sharding.shards, sharding.warmup_s, resolved.config.trace)
        return cls(resolved, sharding, trace, cut)

    @classmethod
    def cut_file(
        cls,
        resolved: ResolvedRun,
        sharding: Sharding,
        copies: dict[tuple[Any, ...], Retimed | None] | None = None,
    ) -> ShardedRun | None:
        """Windows over the run's trace file, read in slices (kvsim.shard.source); None when
        the run's trace is not such a file, or sharding does not split it. `copies`: re-timed
        copies to share between runs of one trace and cost model (a plan's); their owner
        closes them, else the run does (`close`)."""
        from kvsim.run import trace_options

        config = resolved.config
        options = trace_options(config)
        if sharding.shards == 1 or not streamable(config.trace, options):
            return None
        check_shardable(resolved, sharding)
        cost, chunk = run_cost_model(resolved)
        engine = resolved.engine.config
        key = (
            config.trace,
            options["max_requests"],
            resolved.model.name,
            resolved.profile.name,
            engine.tp,
            engine.kv_dtype,
            engine.weight_dtype,
            str(resolved.engine.engine.source_path),
            chunk,
        )
        if copies is not None and key in copies:
            copy = copies[key]
        else:
            copy = stream_retimed(config.trace, cost, chunk, options["max_requests"])
            if copies is not None:
                copies[key] = copy
        if copy is None:
            return None
        try:
            cut = windows(copy.arrival_s, sharding.shards, sharding.warmup_s, config.trace)
        except BaseException:
            if copies is None:
                copy.close()
            raise
        return cls(resolved, sharding, copy, cut, owns_copy=copies is None)

    def tasks(self, first_index: int = 0) -> list[WindowTask]:
        """A task per window, numbered from `first_index` (a plan runs many runs' at once)."""
        config = self.resolved.config
        file = self.trace.file if isinstance(self.trace, Retimed) else None
        return [WindowTask(first_index + k, config, w, file) for k, w in enumerate(self.windows)]

    def close(self) -> None:
        """Remove the re-timed copy, if any."""
        if isinstance(self.trace, Retimed) and self.owns_copy:
            self.trace.close()

    def merge(self, outcomes: list[WindowOutcome], wall_s: float) -> tuple[Any, dict[str, Any]]:
        """(the merged RunResult, the sharding figures for the summary: shards, warmup_s,
        sharding, shard_wall_s, shard_cpu_s, shard_peak_rss_bytes)."""
        for k, outcome in enumerate(outcomes):
            if outcome.error is not None:
                raise ShardError(f"shard {k + 1} of {len(outcomes)}: {outcome.error}")
        result = merge([o.result for o in outcomes])  # type: ignore[misc]
        result.wall_s = wall_s
        sharding = self.sharding
        figures: dict[str, Any] = {"shards": sharding.shards, "warmup_s": float(sharding.warmup_s)}
        if sharding.shards > 1:
            figures["sharding"] = APPROXIMATION.format(
                shards=sharding.shards, warmup_s=sharding.warmup_s
            )
            figures["shard_wall_s"] = [o.run_s for o in outcomes]
            figures["shard_cpu_s"] = [o.cpu_s for o in outcomes]
            figures["shard_peak_rss_bytes"] = [o.peak_rss_bytes for o in outcomes]
        return result, figures


def run_sharded(
    resolved: ResolvedRun,
    sharding: Sharding,
    *,
    trace: Trace | None = None,
    progress: ProgressFn | None = None,
) -> tuple[Any, dict[str, Any], Trace | Retimed]:
    """Run `resolved` as `sharding` says; returns (the merged RunResult, sharding figures for
    the summary, what was read of the trace). A trace file not given loaded is read in
    slices when it can be (kvsim.shard.source)."""
    from kvsim.run import trace_options
    from kvsim.sweep.executors import open_executor

    sharded = None if trace is not None else ShardedRun.cut_file(resolved, sharding)
    if sharded is None:
        if trace is None:
            trace = load_trace(resolved.config.trace, **trace_options(resolved.config))
        sharded = ShardedRun.cut(resolved, sharding, trace)
    try:
        wall = time.perf_counter()
        count = len(sharded.windows)
        if count == 1:
            assert isinstance(sharded.trace, Trace)
            outcomes = [_here(resolved, sharded.trace, sharded.windows[0], progress)]
            result, figures = sharded.merge(outcomes, time.perf_counter() - wall)
            return result, figures, sharded.trace
        jobs = sharding.jobs or min(count, os.cpu_count() or 1)
        outcomes = [WindowOutcome(k, None, "not run", math.nan, None, "") for k in range(count)]
        with open_executor(
            sharding.executor, jobs=jobs, ray_address=sharding.ray_address, call=run_window_task
        ) as executor:
            for done, outcome in enumerate(executor.run(sharded.tasks()), 1):
                if outcome.error is not None:
                    raise ShardError(f"shard {outcome.index + 1} of {count}: {outcome.error}")
                outcomes[outcome.index] = outcome
                if progress is not None:
                    progress(done, count)
        result, figures = sharded.merge(outcomes, time.perf_counter() - wall)
        return result, figures, sharded.trace
    finally:
        sharded.close()


def _here(
    resolved: ResolvedRun, trace: Trace, window: Window, progress: ProgressFn | None
) -> WindowOutcome:
    start = time.perf_counter()
    result = run_resolved_window(resolved, trace, window, progress)
    return WindowOutcome(0, result, None, time.perf_counter() - start, None, "")


class ShardError(KvsimError):
    """A window that failed: the run has no result (nothing is written)."""


def run_split(
    config: RunConfig,
    sharding: Sharding,
    progress: ProgressFn | None = None,
    *,
    trace: Trace | None = None,
) -> Any:
    """`kvsim.run.run` split as `sharding` says: resolve, load, run the windows, summarise
    (a `kvsim.run.RunOutcome`, its summary with the sharding figures)."""
    return run_resolved_split(resolve(config), sharding, progress, trace=trace)


def run_resolved_split(
    resolved: ResolvedRun,
    sharding: Sharding,
    progress: ProgressFn | None = None,
    *,
    trace: Trace | None = None,
) -> Any:
    """`run_split` for a config `kvsim.resolve.resolve` has already checked."""
    from kvsim.run import outcome_of

    check_shardable(resolved, sharding)
    result, figures, read = run_sharded(resolved, sharding, trace=trace, progress=progress)
    return outcome_of(resolved, read, result, figures)

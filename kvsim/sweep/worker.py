"""What one worker process does for one configuration: reuse a loaded trace, run, measure.

A worker (a pool process, a Ray worker, or the calling process when serial) keeps the last
`TRACE_CACHE_SIZE` traces it loaded, keyed by the trace and every `load_trace` option
(`kvsim.run.trace_options`), so a sweep over policies or replicas loads its trace once per
worker; the bound keeps a worker's memory from growing with the number of distinct traces.

Peak memory: on Linux the process's resident high-water mark (VmHWM) is reset before each
configuration (``/proc/self/clear_refs``), so ``peak_rss_bytes`` is this configuration's peak,
the cached trace and the interpreter included; where that is not possible it is the process's
peak so far (``getrusage``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from kvsim.errors import KvsimError
from kvsim.run import RunConfig, json_safe, run, trace_options
from kvsim.traces import Trace, load_trace

#: Traces one worker keeps loaded (least recently used dropped first).
TRACE_CACHE_SIZE = 2
_traces: OrderedDict[tuple[Any, ...], Trace] = OrderedDict()


@dataclass(frozen=True)
class Task:
    """One configuration to run; picklable, so it can travel to a pool or Ray worker."""

    index: int
    id: str
    config: RunConfig
    keep_requests: bool = False


@dataclass
class TaskResult:
    """What a worker sends back: a JSON-safe summary or the one-line error, and measurements."""

    index: int
    id: str
    config: RunConfig  # resolved (the weight dtype filled in) when the run succeeded
    error: str | None
    summary: dict[str, Any] | None
    run_s: float  # wall seconds in the worker, trace loading included
    peak_rss_bytes: int | None
    worker: str  # host:pid
    tables: dict[str, pa.Table] = field(default_factory=dict)  # only with keep_requests


def run_task(task: Task) -> TaskResult:
    """Run one configuration; any exception becomes its one-line error (the sweep carries on).

    KvsimError messages are the user's; anything else is a kvsim bug, reported with its type.
    """
    _reset_peak_rss()
    start = time.perf_counter()
    config, summary, error, tables = task.config, None, None, {}
    try:
        outcome = run(task.config, trace=cached_trace(task.config))
        config, summary = outcome.config, json_safe(outcome.summary)
        if task.keep_requests:
            tables["requests.parquet"] = outcome.result.requests_with_compression()
            if outcome.result.timeline is not None:
                tables["timeline.parquet"] = outcome.result.timeline
    except KvsimError as exc:
        error = one_line(str(exc))
    except Exception as exc:  # a bug in kvsim or a plugin: recorded, the others carry on
        error = one_line(f"{type(exc).__name__}: {exc}")
    return TaskResult(
        index=task.index,
        id=task.id,
        config=config,
        error=error,
        summary=summary,
        run_s=time.perf_counter() - start,
        peak_rss_bytes=peak_rss_bytes(),
        worker=f"{socket.gethostname()}:{os.getpid()}",
        tables=tables,
    )


def cached_trace(config: RunConfig) -> Trace:
    """The config's trace, loaded once per worker for each distinct set of options."""
    options = trace_options(config)
    key: tuple[Any, ...] = (config.trace, *sorted(options.items()))
    path = Path(config.trace)
    if path.is_file():  # a file edited between configurations is loaded afresh
        stat = path.stat()
        key += (stat.st_mtime_ns, stat.st_size)
    trace = _traces.get(key)
    if trace is None:
        trace = load_trace(config.trace, **options)
        _traces[key] = trace
        while len(_traces) > TRACE_CACHE_SIZE:
            _traces.popitem(last=False)
    else:
        _traces.move_to_end(key)
    return trace


def one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM (Linux >= 4.0)
    except OSError:
        pass


def peak_rss_bytes() -> int | None:
    """The process's resident high-water mark in bytes (see the module docstring)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024

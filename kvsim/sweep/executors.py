"""Where configurations run: serially here, on a local process pool, or on a Ray cluster.

An executor takes `Task`s and yields their `TaskResult`s as they finish, in any order; the
caller puts them back in order. An executor stays open across calls to `Executor.run`, so its
workers keep their loaded traces from one batch to the next (a planner's many small batches
pay the start-up and the trace loading once); close it, or use it as a context manager.

- `LocalExecutor`: ``jobs=1`` runs in this process; more uses a ``spawn`` process pool (no
  state inherited by fork, the same on every platform). A worker killed by the OS breaks the
  pool: that is a `SweepError`, and a sweep with an ``out`` folder resumes where it stopped.
  No worker outlives the pool: Ctrl-C (which the workers ignore) and, while the pool is open in
  the main thread, SIGTERM and SIGHUP to this process stop the workers before this process
  ends (exit status 128 + the signal); and each worker watches its parent from its first
  moment, exiting by itself within half a second when the parent is gone (``kill -9``, a
  crash; `kvsim.workerguard`), so nothing goes on computing for nobody.
- `RayExecutor`: one Ray task per configuration, one CPU each. Without an address it starts a
  local Ray with ``num_cpus = jobs`` (and shuts it down on close); with one it connects to that
  cluster, where kvsim and the traces must be installed on every node. Results come back to
  the caller, which writes them, so workers need no shared file system.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from types import TracebackType
from typing import Any

from kvsim.errors import KvsimError
from kvsim.sweep.worker import Task, TaskResult, one_line, run_task
from kvsim.workerguard import init_worker

EXECUTORS = ("local", "ray")
#: Signals that stop the pool with this process, when their handler is the default one.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class SweepError(KvsimError):
    """A sweep that cannot go on: no Ray, an unreachable cluster, a worker killed by the OS."""


class Executor:
    """Runs tasks, yielding results as they finish. Subclasses implement `run` and `close`."""

    jobs: int

    def run(self, tasks: Sequence[Task]) -> Iterator[TaskResult]:
        raise NotImplementedError

    def close(self) -> None:
        """Release the workers (idempotent)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def default_jobs() -> int:
    """One worker per CPU this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def open_executor(
    kind: str = "local",
    *,
    jobs: int | None = None,
    ray_address: str | None = None,
    call: Callable[[Any], Any] = run_task,
) -> Executor:
    """An executor by name ('local' or 'ray'); `jobs` defaults to the CPU count. `call` is what
    each task runs through (a module-level function, so it can be pickled): a sweep's
    `run_task`, or a sharded run's window (kvsim.shard). It must return its errors as values;
    a Ray worker that dies yields `call.failed(task, message)` when `call` has one, else a
    `TaskResult` with the error."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise SweepError(f"jobs (-j): expected a positive integer, got {jobs!r}")
    jobs = jobs or default_jobs()
    if kind == "local":
        if ray_address is not None:
            raise SweepError("--ray-address: only with --executor ray")
        return LocalExecutor(jobs, call)
    if kind == "ray":
        return RayExecutor(jobs, ray_address, call)
    raise SweepError(f"executor: expected one of {', '.join(EXECUTORS)}, got {kind!r}")


class LocalExecutor(Executor):
    """This process for one job, else a pool of `jobs` spawned processes (started lazily)."""

    def __init__(self, jobs: int, call: Callable[[Any], Any] = run_task) -> None:
        self.jobs = jobs
        self.call = call
        self._pool: ProcessPoolExecutor | None = None
        self._handlers: dict[int, Any] = {}  # signal -> the handler before ours

    def run(self, tasks: Sequence[Task]) -> Iterator[TaskResult]:
        if self.jobs == 1:
            for task in tasks:
                yield self.call(task)
            return
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                max_workers=self.jobs,
                mp_context=context,
                initializer=init_worker,
                initargs=(os.getpid(),),
            )
            self._catch_signals()
        pending = {self._pool.submit(self.call, task) for task in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        except BrokenProcessPool:
            self._stop()
            raise SweepError(
                "a worker process died (killed by the OS, perhaps for memory); configurations "
                "that finished are saved, and rerunning the sweep resumes from them"
            ) from None
        except BaseException:  # Ctrl-C, or the caller stopped: do not wait for running tasks
            self._stop()
            raise
        finally:
            for future in pending:
                future.cancel()

    def _stop(self) -> None:
        """End the workers now, abandoning what they run."""
        self._release_signals()
        if self._pool is None:
            return
        for process in list(getattr(self._pool, "_processes", {}).values()):
            process.terminate()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def close(self) -> None:
        self._release_signals()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    # -- signals -----------------------------------------------------------------------------------
    def _catch_signals(self) -> None:
        """While the pool is open: SIGTERM or SIGHUP to this process raises SystemExit, so the
        workers are stopped on the way out (only in the main thread, and only where the handler
        is the default one: a program's own handler is left alone)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            try:
                if signal.getsignal(signum) == signal.SIG_DFL:
                    self._handlers[signum] = signal.signal(signum, self._on_signal)
            except (OSError, ValueError):
                continue

    def _release_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        while self._handlers:
            signum, handler = self._handlers.popitem()
            try:
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, handler)
            except (OSError, ValueError):
                continue

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._release_signals()  # a second signal ends this process at once
        name = signal.Signals(signum).name
        sys.stderr.write(f"kvsim: {name}: stopping the worker processes\n")
        raise SystemExit(128 + signum)


class RayExecutor(Executor):
    """Ray tasks of one CPU each; a local Ray of `jobs` CPUs unless `address` names a cluster."""

    def __init__(
        self, jobs: int, address: str | None = None, call: Callable[[Any], Any] = run_task
    ) -> None:
        try:
            import ray
        except ImportError:
            raise SweepError(
                "--executor ray needs Ray, which is not installed: pip install 'kvsim[ray]'"
            ) from None
        self.jobs = jobs
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            try:
                if address is None:
                    ray.init(
                        num_cpus=jobs,
                        include_dashboard=False,
                        log_to_driver=False,
                        logging_level="ERROR",
                        configure_logging=True,
                    )
                else:
                    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            except Exception as exc:  # ConnectionError, RuntimeError, ValueError
                where = f"the Ray cluster at {address}" if address else "a local Ray"
                raise SweepError(f"cannot start {where}: {one_line(str(exc))}") from None
            self._started = True
        self.call = call
        self._remote: Any = ray.remote(num_cpus=1)(call)

    def run(self, tasks: Sequence[Task]) -> Iterator[TaskResult]:
        ray = self._ray
        refs = {self._remote.remote(task): task for task in tasks}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    task = refs[ref]
                    try:
                        yield ray.get(ref)
                    except ray.exceptions.RayError as exc:  # the worker died, not the run
                        failed = getattr(self.call, "failed", None)
                        if failed is not None:
                            yield failed(task, one_line(f"Ray worker failed: {exc}")[:500])
                            continue
                        yield TaskResult(
                            index=task.index,
                            id=task.id,
                            config=task.config,
                            error=one_line(f"Ray worker failed: {exc}")[:500],
                            summary=None,
                            run_s=float("nan"),
                            peak_rss_bytes=None,
                            worker="ray",
                        )
        finally:
            for ref in pending:
                ray.cancel(ref)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False

"""How a plan runs its simulations: a callable from configs to their summaries, in order.

The search never calls the engine itself; it hands each round's independent runs to a `Runner`,
so the same plan runs serially here, on a local process pool or on a Ray cluster (kvsim.sweep's
executors). `CachedRunner` sits in front of any of them: a configuration the plan already ran
(two stages reaching the same deployment) is answered from memory, and only the figures the plan
reads are kept, so memory stays small over hundreds of runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from kvsim.errors import KvsimError
from kvsim.run import RunConfig, json_safe

Summary = dict[str, Any]
#: Runs configs (independent of each other, in any order or at once) and returns their
#: summaries in the order given; a run that fails on bad input returns {"error": "one line"}.
Runner = Callable[[Sequence[RunConfig]], list[Summary]]

#: Summary keys a plan reads (the rest of a run's summary is dropped once it has run).
KEPT = (
    "requests",
    "completed",
    "ttft_p99_s",
    "tpot_p99_s",
    "goodput_tokens_per_s",
    "slo_attainment",
    "prefix_hit_ratio",
    "hit_ratio_by_tier",
    "cost_per_million_tokens_usd",
    "simulated_s",
    "wall_s",
    "error",
)


def serial_runner(configs: Sequence[RunConfig]) -> list[Summary]:
    """One run after another in this process (kvsim.run.run)."""
    from kvsim.run import run

    out: list[Summary] = []
    for config in configs:
        try:
            out.append(run(config).summary)
        except KvsimError as exc:
            out.append({"error": str(exc)})
    return out


class CachedRunner:
    """A runner that runs each distinct config once, and counts runs and rounds."""

    def __init__(self, runner: Runner, on_round: Callable[[int, int], None] | None = None) -> None:
        self.runner = runner
        self.on_round = on_round  # (runs in this round, runs so far)
        self.cache: dict[RunConfig, Summary] = {}
        self.runs = 0
        self.rounds = 0

    def __call__(self, configs: Sequence[RunConfig]) -> list[Summary]:
        new = [c for c in dict.fromkeys(configs) if c not in self.cache]
        if new:
            results = self.runner(new)
            if len(results) != len(new):
                raise RuntimeError(f"runner returned {len(results)} summaries for {len(new)} runs")
            for config, summary in zip(new, results, strict=True):
                # NaN as None, as kvsim.sweep returns it, so every runner gives equal figures
                self.cache[config] = json_safe({k: summary[k] for k in KEPT if k in summary})
            self.runs += len(new)
            self.rounds += 1
            if self.on_round:
                self.on_round(len(new), self.runs)
        return [self.cache[c] for c in configs]


def sweep_available() -> bool:
    """True when kvsim.sweep (the pool and Ray executors) is installed in this build."""
    import importlib.util

    return importlib.util.find_spec("kvsim.sweep") is not None


class SweepRunner:
    """A runner on kvsim.sweep's executors, kept open for the whole plan (workers keep traces).

    Use as a context manager; ``executor`` is 'local' (a process pool of `jobs`, this process
    for one job) or 'ray' (a local Ray, or the cluster at `ray_address`).
    """

    def __init__(
        self,
        executor: str,
        jobs: int | None = None,
        ray_address: str | None = None,
        call: Callable[[Any], Any] | None = None,
    ):
        from kvsim.sweep import open_executor

        extra = {} if call is None else {"call": call}  # the executor's task function
        self._executor = open_executor(executor, jobs=jobs, ray_address=ray_address, **extra)

    def __call__(self, configs: Sequence[RunConfig]) -> list[Summary]:
        from kvsim.sweep import run_many

        results = run_many(configs, executor=self._executor, progress=False)
        # a run that completed no request is a failed configuration to a sweep, but it ran: the
        # plan reads its summary (requests that do not complete), as from the serial runner
        return [r.summary if r.summary is not None else {"error": r.error} for r in results]

    def close(self) -> None:
        self._executor.close()

    def __enter__(self) -> SweepRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShardedRunner(SweepRunner):
    """A runner whose every run is time-sharded (kvsim.shard): the windows of all the runs of a
    round go to one executor together, so a cluster stays busy with a round's runs and their
    windows at once. A run that cannot be split (a P/D split, KV compression) runs whole, in
    one task. Use as a context manager, like `SweepRunner`."""

    def __init__(
        self,
        sharding: Any,
        executor: str = "local",
        jobs: int | None = None,
        ray_address: str | None = None,
    ) -> None:
        from kvsim.shard.run import run_window_task

        super().__init__(executor, jobs, ray_address, call=run_window_task)
        self.sharding = sharding
        # a trace file re-timed once per cost model, read in slices by every run of the plan
        self._copies: dict[tuple[Any, ...], Any] = {}

    def close(self) -> None:
        for copy in self._copies.values():
            if copy is not None:
                copy.close()
        self._copies.clear()
        super().close()

    def __call__(self, configs: Sequence[RunConfig]) -> list[Summary]:
        import time

        from kvsim.resolve import resolve
        from kvsim.run import outcome_of
        from kvsim.shard.run import ShardedRun, unshardable
        from kvsim.sweep.worker import cached_trace

        out: list[Summary] = [{} for _ in configs]
        runs: dict[int, ShardedRun] = {}
        tasks = []
        for i, config in enumerate(configs):
            try:
                resolved = resolve(config)
                sharding = self.sharding
                if unshardable(resolved) is not None:
                    sharding = dataclasses.replace(sharding, shards=1)
                run = ShardedRun.cut_file(resolved, sharding, self._copies) or ShardedRun.cut(
                    resolved, sharding, cached_trace(resolved.config)
                )
            except KvsimError as exc:
                out[i] = {"error": str(exc)}
                continue
            runs[i] = run
            tasks += run.tasks(first_index=len(tasks))
        owner = [(i, k) for i, run in runs.items() for k in range(len(run.windows))]
        outcomes: dict[int, list[Any]] = {i: [None] * len(run.windows) for i, run in runs.items()}
        start = time.perf_counter()
        for outcome in self._executor.run(tasks):
            i, k = owner[outcome.index]
            outcomes[i][k] = outcome
        wall = time.perf_counter() - start
        for i, run in runs.items():
            try:
                result, figures = run.merge(outcomes[i], wall)
                out[i] = outcome_of(run.resolved, run.trace, result, figures).summary
            except KvsimError as exc:
                out[i] = {"error": str(exc)}
        return out

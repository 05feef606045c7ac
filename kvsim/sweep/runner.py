"""Run many configurations on an executor, resumably, and gather one result per configuration.

With an ``out`` folder each configuration that succeeds is written, as it finishes, to
``out/runs/<id>/`` through `kvsim.run.ResultsFolder` (a temporary folder renamed into place,
``COMPLETE`` last): config.toml and summary.json, plus requests.parquet and timeline.parquet
with ``keep_requests``. A configuration whose folder is complete is not run again but read
back (resume). A failed configuration writes nothing, so a rerun tries it again.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError, KvsimError
from kvsim.run import ResultsFolder, RunConfig, is_complete
from kvsim.sweep.executors import Executor, open_executor
from kvsim.sweep.progress import SweepProgress
from kvsim.sweep.spec import (
    Configuration,
    check_configuration,
    config_id,
    describe,
    load_spec,
    varying_params,
)
from kvsim.sweep.table import results_table, write_table
from kvsim.sweep.worker import Task, TaskResult

RESULTS_FILE = "results.parquet"


@dataclass(frozen=True)
class ConfigResult:
    """One configuration's outcome. ``summary`` is `kvsim.run.run`'s summary made JSON-safe
    (NaN as None) plus ``summary["sweep"]`` = {run_s, peak_rss_bytes, worker}."""

    id: str
    config: RunConfig  # as resolved by the run (the weight dtype filled in) when it succeeded
    params: dict[str, Any]
    status: str  # "ok" or "failed"
    error: str | None
    summary: dict[str, Any] | None
    resumed: bool = False  # read back from a finished folder instead of run
    folder: Path | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_many(
    configs: Sequence[RunConfig],
    *,
    executor: str | Executor = "local",
    jobs: int | None = None,
    ray_address: str | None = None,
    out: str | Path | None = None,
    params: Sequence[Mapping[str, Any]] | None = None,
    keep_requests: bool = False,
    progress: bool = True,
) -> list[ConfigResult]:
    """Run every config and return their results in the same order (see kvsim.sweep).

    Every config is checked (`check_configuration`) before any runs. Equal configs run once.
    `executor` is 'local', 'ray' or an open `Executor` (left open, for reuse). `params` names
    each config's parameters in the table (default: the keys whose values differ among
    `configs`). With `out`, results are written to ``out/runs/<id>/`` and finished ones resumed.
    """
    configs = list(configs)
    if params is None:
        params = varying_params(configs)
    if len(params) != len(configs):
        raise ValueError(f"params: {len(params)} entries for {len(configs)} configs")
    ids = []
    for i, config in enumerate(configs):
        try:
            check_configuration(config)
        except KvsimError as exc:
            label = describe(params[i]) or f"number {i + 1}"
            raise ConfigError(f"configuration {label}: {exc}") from None
        ids.append(config_id(config))
    runs = Path(out) / "runs" if out is not None else None
    if runs is not None:
        _make_dir(runs)
    results: dict[str, ConfigResult] = {}
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, (cid, config) in enumerate(zip(ids, configs, strict=True)):
        if cid in seen:
            continue
        seen.add(cid)
        done = _read_finished(runs / cid, cid, dict(params[i])) if runs is not None else None
        if done is not None:
            results[cid] = done
        else:
            tasks.append(Task(i, cid, config, keep_requests))
    bar = SweepProgress(len(results) + len(tasks), resumed=len(results), enabled=progress)
    owned = not isinstance(executor, Executor)
    pool = open_executor(executor, jobs=jobs, ray_address=ray_address) if owned else executor
    try:
        for got in pool.run(tasks):
            result = _record(got, dict(params[got.index]), runs)
            results[result.id] = result
            bar.advance(failed=not result.ok)
    finally:
        bar.close()
        if owned:
            pool.close()
    return [results[cid] for cid in ids]


def run_sweep(
    spec: str | Path | Sequence[Configuration],
    out: str | Path,
    *,
    spec_file: str | Path | None = None,
    executor: str | Executor = "local",
    jobs: int | None = None,
    ray_address: str | None = None,
    keep_requests: bool = False,
    progress: bool = True,
) -> list[ConfigResult]:
    """`kvsim sweep`: expand and check the spec (a file, or configurations already loaded from
    `spec_file`), run it into `out` (resuming what is finished), and write
    ``out/results.parquet`` beside a copy of the spec. The table is removed first and written
    only at the end, so an interrupted sweep leaves no table that looks complete."""
    if isinstance(spec, str | Path):
        spec_file, configurations = spec, load_spec(spec)
    else:
        configurations = list(spec)
    out = Path(out)
    _make_dir(out)
    (out / RESULTS_FILE).unlink(missing_ok=True)
    copy = out / "spec.toml"
    if spec_file is not None and Path(spec_file).resolve() != copy.resolve():
        try:
            shutil.copyfile(spec_file, copy)  # what the table was made from
        except OSError as exc:
            raise ConfigError(f"{copy}: cannot write: {exc.strerror or exc}") from None
    results = run_many(
        [c.config for c in configurations],
        params=[c.params for c in configurations],
        executor=executor,
        jobs=jobs,
        ray_address=ray_address,
        out=out,
        keep_requests=keep_requests,
        progress=progress,
    )
    write_table(results_table(results), out / RESULTS_FILE)
    return results


def _make_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: is a file, not a folder; give a folder for the results")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot create the folder: {exc.strerror or exc}") from None


def _read_finished(folder: Path, cid: str, params: dict[str, Any]) -> ConfigResult | None:
    """A finished configuration's result from its folder, or None to run it."""
    if not is_complete(folder):
        return None
    try:
        summary = json.loads((folder / "summary.json").read_text())
        config = RunConfig.from_toml(folder / "config.toml")
    except (OSError, ValueError, KvsimError):
        return None  # damaged: run it again (ResultsFolder replaces kvsim's own files)
    return ConfigResult(cid, config, params, "ok", None, summary, resumed=True, folder=folder)


def _record(got: TaskResult, params: dict[str, Any], runs: Path | None) -> ConfigResult:
    """The result of a finished task, written to its folder first when it succeeded."""
    if got.error is not None or got.summary is None:
        return ConfigResult(got.id, got.config, params, "failed", got.error, None)
    summary = dict(got.summary)
    summary["sweep"] = {
        "run_s": got.run_s,
        "peak_rss_bytes": got.peak_rss_bytes,
        "worker": got.worker,
    }
    folder = None
    if runs is not None:
        try:
            folder = ResultsFolder(runs / got.id, overwrite=True).write_files(
                got.config, summary, got.tables
            )
        except KvsimError as exc:
            return ConfigResult(got.id, got.config, params, "failed", str(exc), None)
    # what a resumed sweep reads back: the same values, through the same JSON
    summary = json.loads(json.dumps(summary))
    return ConfigResult(got.id, got.config, params, "ok", None, summary, folder=folder)

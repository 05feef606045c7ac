"""Run many configurations on an executor, resumably, and gather one result per configuration.

With an ``out`` folder each configuration that succeeds is written, as it finishes, to
``out/runs/<id>/`` through `kvsim.run.ResultsFolder` (a temporary folder renamed into place,
``COMPLETE`` last): config.toml and summary.json, plus requests.parquet and timeline.parquet
with ``keep_requests``. A configuration whose folder is complete is not run again but read
back (resume). A failed configuration writes nothing, so a rerun tries it again; one that ran
but completed no request (`kvsim.run.nothing_completed`: `kvsim run` exits 2 for it) is written
like a success, as `kvsim run` writes it, and recorded as failed with the reason, read back the
same way on resume. Temporary folders of configurations killed while being written are removed
(`kvsim.atomic.remove_stale`).

Everything written goes through `kvsim.atomic`: a folder that cannot be written (read-only, a
full disk) is one `WriteError` line, checked before any configuration runs; a write that fails
later stops the sweep (every configuration after it would fail the same way), keeping what
finished.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.atomic import WriteError, check_writable, os_reason, remove_stale, write_file
from kvsim.errors import ConfigError, KvsimError
from kvsim.run import ResultsFolder, RunConfig, is_complete, nothing_completed
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
    summary: dict[str, Any] | None  # also of a failed run that completed no request
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
        check_writable(runs, "the sweep's results")
        remove_stale(runs)  # folders of configurations killed while being written
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
    stream = pool.run(tasks)
    try:
        for got in stream:
            result = _record(got, dict(params[got.index]), runs)
            results[result.id] = result
            bar.advance(failed=not result.ok)
    finally:
        stream.close()  # after an exception here (Ctrl-C, a failed write): stop the workers now
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
    check_writable(out, "the sweep's results")
    try:
        (out / RESULTS_FILE).unlink(missing_ok=True)
    except OSError as exc:
        raise WriteError(f"{out / RESULTS_FILE}: cannot remove: {os_reason(exc)}") from None
    copy = out / "spec.toml"
    if spec_file is not None and Path(spec_file).resolve() != copy.resolve():
        try:
            text = Path(spec_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{spec_file}: cannot read: {os_reason(exc)}") from None
        write_file(copy, text, what="the copy of the spec")  # what the table was made from
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
        raise WriteError(f"{path}: cannot create the folder: {os_reason(exc)}") from None


def _status(summary: dict[str, Any]) -> tuple[str, str | None]:
    """("ok", None), or ("failed", why) for a run that completed no request."""
    if not nothing_completed(summary):
        return "ok", None
    warnings = summary.get("run_warnings") or []
    why = str(warnings[0]) if warnings else "no request completed"
    return "failed", " ".join(why.split())


def _read_finished(folder: Path, cid: str, params: dict[str, Any]) -> ConfigResult | None:
    """A finished configuration's result from its folder, or None to run it."""
    if not is_complete(folder):
        return None
    try:
        summary = json.loads((folder / "summary.json").read_text())
        config = RunConfig.from_toml(folder / "config.toml")
        status, error = _status(summary)
    except (OSError, ValueError, KvsimError, KeyError, TypeError, AttributeError):
        return None  # damaged: run it again (ResultsFolder replaces kvsim's own files)
    return ConfigResult(cid, config, params, status, error, summary, resumed=True, folder=folder)


def _record(got: TaskResult, params: dict[str, Any], runs: Path | None) -> ConfigResult:
    """The result of a finished task, written to its folder first when it ran (a WriteError
    when that fails stops the sweep)."""
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
        folder = ResultsFolder(runs / got.id, overwrite=True).write_files(
            got.config, summary, got.tables
        )
    # what a resumed sweep reads back: the same values, through the same JSON
    summary = json.loads(json.dumps(summary))
    status, error = _status(summary)
    return ConfigResult(got.id, got.config, params, status, error, summary, folder=folder)

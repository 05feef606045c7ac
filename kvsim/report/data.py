"""Reading what `kvsim report` draws from: a run's results folder or a sweep's folder.

Everything is read and checked before anything is drawn or written, so a folder missing a
file (or one whose run never finished writing) is one `ReportError` line naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.errors import KvsimError
from kvsim.run import COMPLETE_MARKER
from kvsim.sweep.runner import RESULTS_FILE

#: The files a run's folder must hold for a report (COMPLETE is checked after them).
RUN_FILES = ("requests.parquet", "timeline.parquet", "summary.json", "config.toml")
#: A summary column that is never a parameter: the parameters are the columns before it (with
#: the summary's ``trace`` too, unless trace is swept; constant, it varies nothing).
_FIRST_SUMMARY_COLUMN = "skipped_rows"


class ReportError(KvsimError):
    """A folder that is not a finished run or sweep, or a file in it that cannot be read."""


@dataclass(frozen=True)
class RunData:
    """One finished run, as `kvsim run --out` wrote it."""

    folder: Path
    requests: pa.Table
    timeline: pa.Table
    summary: dict[str, Any]
    config_toml: str

    @property
    def cluster(self) -> bool:
        """True for a run of several replicas (or P/D): the summary has `per_replica`."""
        return bool(self.summary.get("per_replica"))


@dataclass(frozen=True)
class SweepData:
    """A finished sweep: its results table and the parameters that vary across it."""

    folder: Path
    table: pd.DataFrame
    params: list[str]  # every parameter column, in the table's order
    varied: list[str]  # those taking more than one value among the successful rows


def is_sweep(folder: str | Path) -> bool:
    """A sweep folder holds results.parquet; a run folder does not."""
    return (Path(folder) / RESULTS_FILE).is_file()


def _folder(folder: str | Path) -> Path:
    path = Path(folder)
    if not path.is_dir():
        raise ReportError(
            f"{path}: no such folder; give a run's results folder (kvsim run --out) "
            "or a sweep's (kvsim sweep --out)"
        )
    return path


def _parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ReportError(f"{path}: cannot read: {' '.join(str(exc).split())}") from None


def load_run(folder: str | Path) -> RunData:
    """Read a run's folder; a missing file, or no COMPLETE marker, is a ReportError naming it."""
    path = _folder(folder)
    if (path / "runs").is_dir() and not (path / "summary.json").exists():  # a sweep cut short
        raise ReportError(
            f"{path / RESULTS_FILE}: missing; the sweep did not finish: run kvsim sweep again "
            "with the same --out to finish it (what finished is resumed), then report"
        )
    for name in RUN_FILES:
        if not (path / name).is_file():
            hint = (
                " (a sweep keeps it only with --keep-requests)" if name.endswith("parquet") else ""
            )
            raise ReportError(f"{path / name}: missing; not a finished run's folder{hint}")
    if not (path / COMPLETE_MARKER).is_file():
        raise ReportError(
            f"{path / COMPLETE_MARKER}: missing; the run did not finish writing its results"
        )
    try:
        summary = json.loads((path / "summary.json").read_text())
        config = (path / "config.toml").read_text()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"{path}: cannot read: {' '.join(str(exc).split())}") from None
    if not isinstance(summary, dict) or "ttft_p50_s" not in summary:
        raise ReportError(f"{path / 'summary.json'}: not a kvsim run summary")
    requests = _parquet(path / "requests.parquet")
    timeline = _parquet(path / "timeline.parquet")
    for table, name, column in ((requests, "requests", "ttft_s"), (timeline, "timeline", "time_s")):
        if column not in table.column_names:
            raise ReportError(f"{path / (name + '.parquet')}: no column {column!r}")
    return RunData(path, requests, timeline, summary, config)


def load_sweep(folder: str | Path) -> SweepData:
    """Read a sweep's results.parquet and find its parameter columns (see kvsim.sweep.table:
    ``id``, ``status``, ``error``, the parameters, then the flattened summary)."""
    path = _folder(folder)
    file = path / RESULTS_FILE
    if not file.is_file():
        raise ReportError(f"{file}: missing; not a finished sweep's folder")
    table = _parquet(file).to_pandas()
    columns = list(table.columns)
    if columns[:3] != ["id", "status", "error"]:
        raise ReportError(f"{file}: not a kvsim sweep table (its first columns are {columns[:3]})")
    end = columns.index(_FIRST_SUMMARY_COLUMN) if _FIRST_SUMMARY_COLUMN in columns else None
    params = columns[3:end]
    ok = table[table["status"] == "ok"]
    varied = [p for p in params if ok[p].astype(str).nunique() > 1]
    return SweepData(path, table, params, varied)

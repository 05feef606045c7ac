"""Azure LLM inference traces (2023 Splitwise code/conv, 2024 week-long DynamoLLM) → canonical.

Both years use `TIMESTAMP,ContextTokens,GeneratedTokens`: an absolute date-time (2023: 7 fraction
digits, no zone; 2024: mixed precision with `+00:00`), the prompt and the generated token counts.
Everything kept is real: arrivals (relative to the first row) and lengths. There are no sessions
and no prefix information, so each row is its own single-turn session with one opaque segment that
no other request shares: the trace says nothing about reuse, so kvsim assumes none.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.traces.common import Chunked, RowErrors
from kvsim.traces.csvtrace import (
    check_count,
    check_datetimes,
    read_csv_strings,
    report,
    single_turn_requests,
    to_epoch_s,
    to_int,
)

__all__ = ["AZURE_COLUMNS", "read_azure"]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_DOMAIN = 0x417A757265  # "Azure"


def read_azure(
    path: str | Path,
    *,
    name: str | None = None,
    shown: str | None = None,
    skip_bad_rows: bool = False,
) -> Chunked:
    """Read an Azure LLM inference CSV (2023 or 2024 layout) as one chunk."""
    path = Path(path)
    shown = shown or str(path)
    errors = RowErrors(skip=skip_bad_rows)
    csv = read_csv_strings(path, shown, AZURE_COLUMNS)
    bad = np.zeros(len(csv), bool)
    firsts = check_datetimes(csv, "TIMESTAMP", bad)
    firsts += check_count(csv, "ContextTokens", 1, bad)
    firsts += check_count(csv, "GeneratedTokens", 1, bad)
    good = report(csv, bad, firsts, errors)
    if not good.any():
        raise TraceError(f"{shown}: no requests: all {errors.count:,} rows were malformed")
    ctx = np.zeros(len(csv), np.int64)
    gen = np.zeros(len(csv), np.int64)
    ctx[good] = to_int(csv.columns["ContextTokens"].filter(good))
    gen[good] = to_int(csv.columns["GeneratedTokens"].filter(good))
    seconds = to_epoch_s(csv.columns["TIMESTAMP"].filter(good))
    arrival = seconds - seconds.min()
    n = arrival.size
    req = single_turn_requests(arrival, ctx[good], gen[good], np.arange(n), np.zeros(n), _DOMAIN)
    description = (
        f"Azure LLM inference trace {path.name}: real arrivals and token counts; "
        "no sessions or prefix data (each request its own, no reuse assumed)"
    )
    return Chunked(iter([(req, np.inf)]), name or path.stem, None, description, errors)

"""BurstGPT CSV (HPMLL/BurstGPT, Azure OpenAI GPT-3.5/GPT-4 usage) → canonical trace.

Columns: `Timestamp` (seconds from the start of the trace), `Model`, `Request tokens`,
`Response tokens`, `Total tokens`, `Log Type`, and `Session ID` where the release has it
(BurstGPT_3). Real: arrivals and lengths. Rows with a session id become the turns of that session in
time order, arriving at their real times (open loop, no think time). The trace has no prefix data,
so each prompt is one opaque segment no other request shares. Failed requests (0 response tokens,
present in the `BurstGPT_N.csv` files) are kept with 1 output token, since they still occupied a
prefill; the count is in the trace description.

Hints: `category` from `Log Type`: 'chat' for "Conversation log", 'api' for "API log", any other
label as written; a later turn of a session follows the turn before it; no tool calls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvsim.errors import TraceError
from kvsim.traces.common import Chunked, RowErrors
from kvsim.traces.csvtrace import (
    INT_RE,
    NUMBER_RE,
    CsvColumns,
    check_count,
    check_pattern,
    read_csv_strings,
    report,
    single_turn_requests,
    to_float,
    to_int,
)
from kvsim.traces.schema import MAX_CATEGORY_CHARS

__all__ = ["BURSTGPT_COLUMNS", "read_burstgpt"]

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type")  # fmt: skip
_DOMAIN = 0x4275727374  # "Burst"


def _check_finite(csv: CsvColumns, bad: np.ndarray) -> list[tuple[int, str]]:
    """Timestamps that match the number pattern but overflow float64 (e.g. '1e999')."""
    ok = ~bad
    seconds = np.zeros(len(csv))
    if ok.any():
        seconds[ok] = to_float(csv.columns["Timestamp"].filter(pa.array(ok)))
    inf = ok & ~np.isfinite(seconds)
    if not inf.any():
        return []
    bad |= inf
    row = int(np.flatnonzero(inf)[0])
    value = csv.columns["Timestamp"][row].as_py()
    return [(row, f"{csv.shown}:{csv.lines[row]}: field 'Timestamp': expected a finite number "
                  f"of seconds, got {value!r}")]  # fmt: skip


def _categories(log_type: pa.Array) -> np.ndarray:
    """The request kind per row from `Log Type` (see the module docstring)."""
    text = pc.utf8_slice_codeunits(pc.utf8_trim_whitespace(log_type), 0, MAX_CATEGORY_CHARS)
    labels = np.asarray(text.to_numpy(zero_copy_only=False), dtype=str)
    return np.select(
        [labels == "Conversation log", labels == "API log"], ["chat", "api"], default=labels
    )


def read_burstgpt(
    path: str | Path, *, name: str | None = None, shown: str | None = None,
    skip_bad_rows: bool = False,
) -> Chunked:  # fmt: skip
    """Read a BurstGPT CSV as one chunk."""
    path = Path(path)
    shown = shown or str(path)
    errors = RowErrors(skip=skip_bad_rows)
    csv = read_csv_strings(path, shown, BURSTGPT_COLUMNS)
    bad = np.zeros(len(csv), bool)
    firsts = check_pattern(csv, "Timestamp", NUMBER_RE, "a non-negative number of seconds", bad)
    firsts += check_count(csv, "Request tokens", 1, bad)
    firsts += check_count(csv, "Response tokens", 0, bad)  # 0: a failed request, kept (above)
    firsts += check_pattern(csv, "Total tokens", INT_RE, "a non-negative integer", bad)
    firsts += _check_finite(csv, bad)
    good = report(csv, bad, firsts, errors)
    if not good.any():
        raise TraceError(f"{shown}: no requests: all {errors.count:,} rows were malformed")
    cols = {k: v.filter(good) for k, v in csv.columns.items()}
    ts = to_float(cols["Timestamp"])
    req_tok = to_int(cols["Request tokens"])
    resp_tok = to_int(cols["Response tokens"])
    failed = int((resp_tok == 0).sum())
    n = ts.size
    if "Session ID" in cols:
        sid = pc.utf8_trim_whitespace(cols["Session ID"])
        has = pc.not_equal(sid, "").to_numpy(zero_copy_only=False)
        codes = pc.dictionary_encode(sid).indices.to_numpy(zero_copy_only=False).astype(np.int64)
        # Rows without a session id are sessions of their own, numbered after the real ones.
        session = np.where(has, codes, codes.max(initial=0) + 1 + np.arange(n))
    else:
        session = np.arange(n, dtype=np.int64)
    order = np.lexsort((np.arange(n), ts, session))
    s_sorted = session[order]
    first = np.concatenate(([True], s_sorted[1:] != s_sorted[:-1]))
    group = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    turn = np.empty(n, np.int64)
    turn[order] = np.arange(n) - group
    req = single_turn_requests(ts - ts.min(), req_tok, np.maximum(resp_tok, 1), session, turn,
                               _DOMAIN)  # fmt: skip
    req.category = _categories(cols["Log Type"])
    req.follow_previous_turn()
    description = (
        f"BurstGPT {path.name}: real arrivals, token counts"
        + (" and session ids" if "Session ID" in cols else "")
        + "; no prefix data (no reuse assumed)"
        + (f"; {failed} failed requests (0 response tokens) kept with 1 output token" if failed
           else "")
    )  # fmt: skip
    return Chunked(iter([(req, np.inf)]), name or path.stem, None, description, errors)

"""Shared reading for the CSV trace formats (Azure LLM inference, BurstGPT).

Cells are read as strings with pyarrow and checked with vectorised patterns, so a multi-million-row
file is read at C speed while an error still names the file, the line and the field.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from kvsim.errors import TraceError
from kvsim.textio import decode_utf8, one_line
from kvsim.traces.blocks import mix
from kvsim.traces.common import Requests, RowErrors
from kvsim.traces.schema import KIND_CODES, MAX_REQUEST_TOKENS

__all__ = ["CsvColumns", "check_count", "read_csv_strings", "single_turn_requests"]

INT_RE = r"^\s*\d+\s*$"
NUMBER_RE = r"^\s*\d+(\.\d*)?([eE][+-]?\d+)?\s*$"
DATETIME_RE = r"^\s*\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?\s*$"


@dataclass
class CsvColumns:
    """String columns of a CSV file plus the 1-based file line of each row."""

    columns: dict[str, pa.Array]
    lines: np.ndarray
    shown: str

    def __len__(self) -> int:
        return int(self.lines.size)


def read_csv_strings(path: Path, shown: str, required: tuple[str, ...]) -> CsvColumns:
    """All cells as strings; a row with the wrong number of fields is reported by its line."""
    short: list[int] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        short.append(row.number if row.number is not None else -1)
        return "skip"

    try:
        with path.open("rb") as handle:
            first = handle.readline()
    except OSError as exc:
        raise TraceError(f"{shown}: cannot open: {exc.strerror or exc}") from None
    head = decode_utf8(first, shown, TraceError)
    names = [h.strip() for h in head.rstrip("\r\n").split(",")]
    for name in required:
        if name not in names:
            raise TraceError(f"{shown}:1: field {name!r}: missing from the header")
    for name in names:
        if names.count(name) > 1:
            raise TraceError(f"{shown}:1: field {name!r}: appears {names.count(name)} times in "
                             "the header")  # fmt: skip
    try:
        # Before pyarrow: its bad-row callback cannot decode a row that is not UTF-8, and prints
        # a traceback on stderr ("Exception ignored in ...") instead of calling us.
        _check_utf8(path, shown)
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
            parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names}, strings_can_be_null=False
            ),
        )
    except pa.ArrowInvalid as exc:
        raise TraceError(f"{shown}: cannot parse as CSV: {one_line(exc)}") from None
    except OSError as exc:
        raise TraceError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    if short:
        line = short[0] if short[0] > 0 else _first_bad_line(path, shown, len(names))
        where = f"{shown}:{line}" if line > 0 else shown
        raise TraceError(f"{where}: expected {len(names)} fields ({', '.join(names)})")
    lines = np.arange(table.num_rows, dtype=np.int64) + 2
    cols = {n: table.column(n).combine_chunks() for n in names}
    return CsvColumns(cols, lines, shown)


def _check_utf8(path: Path, shown: str) -> None:
    """TraceError naming the first line that is not UTF-8: a pass over the file in 4 MiB chunks
    at C speed, and line by line only to name the line once a bad byte is found."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 22):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
        return
    except UnicodeDecodeError:
        pass
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            decode_utf8(raw, shown, TraceError, line_base=line_no)


def _first_bad_line(path: Path, shown: str, fields: int) -> int:
    """The line of the first row with the wrong field count (only run on the error path)."""
    import csv

    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.reader(handle)
        try:
            next(reader, None)
            for row in reader:
                if len(row) != fields:
                    return reader.line_num
        except csv.Error as exc:  # e.g. a field over the csv module's 128 KiB limit
            raise TraceError(
                f"{shown}:{reader.line_num}: cannot parse as CSV: {one_line(exc)}"
            ) from None
    return -1


def check_pattern(
    csv: CsvColumns, field: str, pattern: str, expected: str, bad: np.ndarray
) -> list[tuple[int, str]]:
    """Mark rows whose `field` misses `pattern` in `bad`; return the first as (row, message)."""
    col = csv.columns[field]
    ok = pc.match_substring_regex(col, pattern).fill_null(False).to_numpy(zero_copy_only=False)
    miss = ~ok
    if not miss.any():
        return []
    bad |= miss
    row = int(np.flatnonzero(miss)[0])
    value = col[row].as_py()
    what = "missing" if value.strip() == "" else f"expected {expected}, got {value!r}"
    return [(row, f"{csv.shown}:{csv.lines[row]}: field {field!r}: {what}")]


def check_count(
    csv: CsvColumns, field: str, low: int, bad: np.ndarray, what: str = "tokens"
) -> list[tuple[int, str]]:
    """Like `check_pattern` for a token count: an integer in [`low`, MAX_REQUEST_TOKENS].

    A prompt of 0 tokens (`low` 1) or a count no real request has (a value over 10^8, or one
    too long for int64) is refused with its line, instead of crashing later in the engine or in
    a pyarrow int32 conversion.
    """
    firsts = check_pattern(csv, field, INT_RE, "a non-negative integer", bad)
    col = pc.utf8_trim_whitespace(csv.columns[field])
    ok = ~bad
    digits = pc.utf8_length(col).to_numpy(zero_copy_only=False)
    too_long = ok & (digits > 18)
    values = np.zeros(len(csv), np.int64)
    fits = ok & ~too_long
    if fits.any():
        values[fits] = to_int(csv.columns[field].filter(pa.array(fits)))
    low_rows = fits & (values < low)
    high_rows = too_long | (fits & (values > MAX_REQUEST_TOKENS))
    for rows, expected in (
        (low_rows, f"an integer >= {low}" + (" (a prompt needs a token)" if low == 1 else "")),
        (high_rows, f"at most {MAX_REQUEST_TOKENS:,} {what} (implausible)"),
    ):
        if rows.any():
            row = int(np.flatnonzero(rows)[0])
            value = col[row].as_py()
            firsts.append((row, f"{csv.shown}:{csv.lines[row]}: field {field!r}: expected "
                                f"{expected}, got {value!r}"))  # fmt: skip
            bad |= rows
    return firsts


def report(csv: CsvColumns, bad: np.ndarray, firsts: list[tuple[int, str]], errors: RowErrors):
    """Raise for the earliest bad row, or (skipping) count the bad rows and return the good mask."""
    if firsts:
        firsts.sort()
        if not errors.skip:
            raise TraceError(firsts[0][1])
        errors.count += int(bad.sum())
        errors.first = errors.first or firsts[0][1]
    return ~bad


def to_int(col: pa.Array) -> np.ndarray:
    return pc.cast(pc.utf8_trim_whitespace(col), pa.int64()).to_numpy(zero_copy_only=False)


def to_float(col: pa.Array) -> np.ndarray:
    return pc.cast(pc.utf8_trim_whitespace(col), pa.float64()).to_numpy(zero_copy_only=False)


def check_datetimes(csv: CsvColumns, field: str, bad: np.ndarray) -> list[tuple[int, str]]:
    """Like `check_pattern` for a date-time: it must also exist (no month 13, no 30 February)."""
    firsts = check_pattern(csv, field, DATETIME_RE, "a date-time", bad)
    ok = ~bad
    try:
        to_epoch_s(csv.columns[field].filter(pa.array(ok)))
        return firsts
    except pa.ArrowInvalid:
        pass
    col = csv.columns[field]
    wrong = np.zeros(len(csv), bool)
    for row in np.flatnonzero(ok):  # the error path only: find which cells do not parse
        try:
            to_epoch_s(col.slice(int(row), 1))
        except pa.ArrowInvalid:
            wrong[row] = True
    row = int(np.flatnonzero(wrong)[0])
    bad |= wrong
    return [*firsts, (row, f"{csv.shown}:{csv.lines[row]}: field {field!r}: expected a valid "
                           f"date-time, got {col[row].as_py()!r}")]  # fmt: skip


def to_epoch_s(col: pa.Array) -> np.ndarray:
    """ISO-like date-times (with or without fraction and UTC offset) to seconds since the epoch."""
    col = pc.utf8_trim_whitespace(col)
    has_zone = pc.match_substring_regex(col, r"(Z|[+-]\d{2}:?\d{2})$")
    zoned = pc.if_else(has_zone, col, pc.binary_join_element_wise(col, "+00:00", ""))
    ns = pc.cast(zoned, pa.timestamp("ns", tz="UTC")).cast(pa.int64())
    return ns.to_numpy(zero_copy_only=False) / 1e9


def single_turn_requests(
    arrival_s: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    session_id: np.ndarray,
    turn: np.ndarray,
    domain: int,
) -> Requests:
    """One opaque segment per non-empty prompt, with a hash no other request shares."""
    n = arrival_s.size
    inputs = np.asarray(input_tokens, np.int64)
    has = inputs > 0
    offsets = np.concatenate(([0], np.cumsum(has))).astype(np.int64)
    rows = np.flatnonzero(has).astype(np.uint64)
    hashes = mix(np.uint64(domain), rows + np.uint64(1), np.zeros(1, np.uint64))
    return Requests(
        session_id=np.asarray(session_id, np.int64),
        turn=np.asarray(turn, np.int64),
        arrival_s=np.asarray(arrival_s, np.float64),
        think_time_s=np.full(n, np.nan),
        input_tokens=inputs,
        output_tokens=np.asarray(output_tokens, np.int64),
        seg_offsets=offsets,
        seg_hashes=hashes if rows.size else np.zeros(0, np.uint64),
        seg_tokens=inputs[has],
        seg_kinds=np.full(rows.size, KIND_CODES["opaque"], np.uint8),
        output_hash=np.zeros(n, np.uint64),
    )

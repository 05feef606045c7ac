"""Mooncake (Kimi) JSONL traces → canonical trace. Everything in them is real; nothing is drawn.

Each line is `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}` with one
chained hash id per 512-token block (see traces/mooncake/PROVENANCE.md). Each row becomes one
single-turn request: its own session, `think_time_s` null (replay of the real timestamps), and one
`opaque` segment per hash id: 512 tokens, except the last, which holds the remainder. Equal ids give
equal segment hashes, and ids are chained upstream, so at block size 512 our block hashes match the
source's blocks one for one, and at other sizes reuse still follows the real shared prefixes.
The reply is not content-addressed (`output_hash` 0): the trace says nothing about its reuse.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.traces.blocks import mix
from kvsim.traces.common import RowErrors, iter_lines, json_object_row
from kvsim.traces.schema import (
    KIND_CODES,
    MAX_REQUEST_TOKENS,
    META_SKIPPED,
    Trace,
    make_trace_table,
)

__all__ = ["MOONCAKE_BLOCK_TOKENS", "load_mooncake"]

MOONCAKE_BLOCK_TOKENS = 512
#: Domain separator, so Mooncake ids never collide with hashes drawn by other sources by design.
_ID_DOMAIN = np.uint64(0x4D6F6F6E63616B65)  # "Mooncake"
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: Below float64's overflow, so an integer timestamp of any length cannot crash the conversion.
_MAX_NUMBER = 1e300


def _bad(where: str, field: str, expected: str, value: object) -> TraceError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return TraceError(f"{where}: field {field!r}: expected {expected}, got {shown}")


def _is_int(value: object) -> bool:
    return type(value) is int


def _check_row(raw: bytes, where: str) -> str | tuple:
    """The row's (timestamp, input, output, hash ids), or the one-line error message."""
    row = json_object_row(raw, where, _FIELDS)
    if isinstance(row, str):
        return row
    ts = row["timestamp"]
    if type(ts) not in (int, float) or not (0 <= ts < _MAX_NUMBER):
        return str(_bad(where, "timestamp", "a non-negative number of milliseconds", ts))
    n_in, n_out, hashes = row["input_length"], row["output_length"], row["hash_ids"]
    if not _is_int(n_in) or n_in < 1:
        return str(_bad(where, "input_length", "a positive integer (a prompt of >= 1 token)", n_in))
    if not _is_int(n_out) or n_out < 1:
        return str(_bad(where, "output_length", "a positive integer", n_out))
    for field, count in (("input_length", n_in), ("output_length", n_out)):
        if count > MAX_REQUEST_TOKENS:
            return str(_bad(where, field, f"at most {MAX_REQUEST_TOKENS:,} tokens", count))
    if type(hashes) is not list or not all(_is_int(h) and 0 <= h < 2**64 for h in hashes):
        return str(_bad(where, "hash_ids", "a list of non-negative integers below 2^64", hashes))
    blocks = -(-n_in // MOONCAKE_BLOCK_TOKENS)
    if len(hashes) != blocks:
        return str(
            _bad(
                where,
                "hash_ids",
                f"ceil(input_length / {MOONCAKE_BLOCK_TOKENS}) = {blocks} ids",
                f"{len(hashes)} ids",
            )
        )
    return ts, n_in, n_out, hashes


def _parse(
    path: Path, shown: str, max_requests: int | None, errors: RowErrors
) -> tuple[list, list, list, list]:
    timestamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    ids: list[list[int]] = []
    for line_no, raw in iter_lines(path, shown):
        if max_requests is not None and len(inputs) >= max_requests:
            break
        if not raw.strip():
            continue
        where = f"{shown}:{line_no}"
        problem = _check_row(raw, where)
        if isinstance(problem, str):
            errors.bad(problem)
            continue
        ts, n_in, n_out, hashes = problem
        timestamps.append(ts)
        inputs.append(n_in)
        outputs.append(n_out)
        ids.append(hashes)
    return timestamps, inputs, outputs, ids


def load_mooncake(
    path: str | Path,
    *,
    name: str | None = None,
    shown: str | None = None,
    max_requests: int | None = None,
    rate: float | None = None,
    rate_scale: float = 1.0,
    errors: RowErrors | None = None,
) -> Trace:
    """Load a Mooncake-format JSONL file; `max_requests` keeps the first N rows.

    Arrivals are the real timestamps divided by `rate_scale`. With `rate` (requests/s), timestamps
    are first stretched so that the loaded rows arrive at that mean rate over their span.
    `shown` is how errors name the file (default: the path as given).
    """
    path = Path(path)
    shown = shown or str(path)
    errors = errors or RowErrors()
    ts, inputs, outputs, ids = _parse(path, shown, max_requests, errors)
    n = len(inputs)
    if n == 0:
        reason = f": all {errors.count:,} rows were malformed and skipped" if errors.count else ""
        raise TraceError(f"{shown}: no requests{reason}")
    arrival_s = np.asarray(ts, dtype=np.float64) / 1000.0
    if rate is not None:
        span_s = float(arrival_s.max() - arrival_s.min())
        if span_s <= 0:
            raise TraceError(f"{shown}: all arrivals at one instant; option 'rate' cannot apply")
        arrival_s = arrival_s * ((n / span_s) / rate)
    arrival_s = arrival_s / rate_scale

    counts = np.fromiter((len(h) for h in ids), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat_ids = np.fromiter((h for row in ids for h in row), dtype=np.uint64, count=int(offsets[-1]))
    seg_tokens = np.full(flat_ids.size, MOONCAKE_BLOCK_TOKENS, dtype=np.int64)
    input_tokens = np.asarray(inputs, dtype=np.int64)
    last = offsets[1:][counts > 0] - 1
    seg_tokens[last] = input_tokens[counts > 0] - MOONCAKE_BLOCK_TOKENS * (counts[counts > 0] - 1)
    seg_hashes = mix(_ID_DOMAIN, flat_ids + np.uint64(1), np.zeros(1, np.uint64))

    request_id = np.arange(n, dtype=np.int64)
    label = name or path.stem
    table = make_trace_table(
        request_id=request_id,
        session_id=request_id,
        turn=np.zeros(n, dtype=np.int32),
        arrival_s=arrival_s,
        think_time_s=None,
        input_tokens=input_tokens,
        output_tokens=np.asarray(outputs, dtype=np.int64),
        seg_offsets=offsets,
        seg_hashes=seg_hashes,
        seg_tokens=seg_tokens,
        seg_kinds=np.full(flat_ids.size, KIND_CODES["opaque"], dtype=np.uint8),
        output_hash=np.zeros(n, dtype=np.uint64),
        name=label,
        native_block_size=MOONCAKE_BLOCK_TOKENS,
        description=(
            f"Mooncake trace {path.name}: real arrivals, token counts and 512-token prefix-block "
            "ids; one single-turn request per row"
            + (f"; times rescaled to {rate:g} req/s" if rate is not None else "")
            + (f"; times divided by rate_scale {rate_scale:g}" if rate_scale != 1.0 else "")
        ),
    )
    if errors.count:
        meta = dict(table.schema.metadata or {})
        meta[META_SKIPPED] = str(errors.count).encode()
        table = table.replace_schema_metadata(meta)
    return Trace.from_table(table, shown)

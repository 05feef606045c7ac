"""`jsonl`: the plain trace format a person or a script can write, one request per line.

Every other source is someone else's format; this one is kvsim's own, in the terms of the
canonical table (see `kvsim.traces.schema` and docs/traces.md). A line is one JSON object:

    {"arrival_s": 0.0, "session": "alice", "output_tokens": 80, "output_hash": "alice-r0",
     "segments": [{"hash": "system-v1", "tokens": 1200, "kind": "system"},
                  {"hash": "alice-q0", "tokens": 35, "kind": "user"}]}

- `arrival_s` (required): seconds from the start of the trace, finite and >= 0.
- `segments` (required): the prompt, a non-empty list of `{"hash", "tokens", "kind"}` objects or
  `[hash, tokens, kind]` triples. `hash` is an integer in [0, 2^64), used as is, or a non-empty
  string, hashed to 64 bits (`string_hash`); equal hashes mean equal content, so a shared system
  prompt or a re-sent history is shared KV. `tokens` is in [1, 10^8]; `kind` is one of
  `SEGMENT_KINDS`, `user` when left out.
- `output_tokens` (required): the reply length, in [1, 10^8].
- `output_hash` (optional): the reply's content hash (integer or string, as above); a later
  segment with the same hash reuses the reply's KV. Left out: 0, not content-addressed.
- `session` (optional): an integer in [0, 2^63) or a string; a row without one is a session of
  its own. A file uses integer sessions or string sessions, not both. Integers are kept as
  the canonical `session_id`; strings are numbered in order of first appearance.
- `turn` (optional): checked, not trusted: turns are a session's rows in (arrival_s, line)
  order, 0, 1, 2, ...; a stated `turn` must equal that place.
- `think_time_s` (optional): for a later turn, issue it this long after the previous turn of its
  session finished (closed loop) instead of at `arrival_s`; null or left out: open loop.
- `input_tokens` (optional): checked against the sum of segment tokens.
- `category` (optional): the request's kind, a string such as 'chat', 'api' or 'agent'; '' when
  left out.
- `tool_wait_s` (optional): the reply is a tool call whose result is expected back in about this
  many seconds (0: unknown), finite and >= 0; null or left out: not a tool call. An expectation,
  not the gap the trace then shows (policies must not see the future).

A later turn's `parent_id` is the turn before it in its session.

Any other field is refused (a typo such as `arrival` would otherwise be silently ignored).
With `skip_bad_rows` a bad row is left out and counted, and its session's later turns move up;
a later row that states its `turn` then no longer matches and is left out too (its history is
not what it says).
Request ids are assigned in canonical (arrival, session, turn) order, so a file replays exactly.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.textio import parse_json
from kvsim.traces.common import Chunked, Requests, RowErrors, iter_lines
from kvsim.traces.schema import KIND_CODES, MAX_CATEGORY_CHARS, MAX_REQUEST_TOKENS, SEGMENT_KINDS

__all__ = ["JSONL_FIELDS", "read_jsonl", "string_hash"]

JSONL_FIELDS = (
    "arrival_s",
    "segments",
    "output_tokens",
    "output_hash",
    "session",
    "turn",
    "think_time_s",
    "input_tokens",
    "category",
    "tool_wait_s",
)
_REQUIRED = ("arrival_s", "segments", "output_tokens")
_HASH_LIMIT = 2**64
_SESSION_LIMIT = 2**63


def string_hash(text: str) -> int:
    """The 64-bit hash a string `hash` stands for: BLAKE2b-64 of its UTF-8, never 0.

    Stable across machines and Python versions (unlike `hash()`), so a file means the same
    everywhere; a script can compute it to mix string and integer hashes on purpose.
    """
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=b"kvsim.jsonl").digest()
    return int.from_bytes(digest, "little") or 1


class _RowError(Exception):
    """One bad row: the field and what is wrong with it."""


def _fail(field: str, message: str) -> _RowError:
    return _RowError(f"field {field!r}: {message}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _count(value: object, field: str, low: int) -> int:
    if type(value) is not int or not low <= value <= MAX_REQUEST_TOKENS:
        raise _fail(
            field, f"expected an integer in [{low}, {MAX_REQUEST_TOKENS:,}], got {_shown(value)}"
        )
    return value


def _seconds(value: object, field: str) -> float:
    if type(value) not in (int, float) or not (0 <= value < 1e300):  # NaN, inf fail here
        raise _fail(field, f"expected a finite number of seconds >= 0, got {_shown(value)}")
    return float(value)


def _hash(value: object, field: str) -> int:
    if type(value) is int and 0 <= value < _HASH_LIMIT:
        return value
    if isinstance(value, str) and value:
        return string_hash(value)
    raise _fail(
        field, f"expected an integer in [0, 2^64) or a non-empty string, got {_shown(value)}"
    )


def _segment(item: object, i: int) -> tuple[int, int, int]:
    """(hash, tokens, kind code) of segment `i`, from an object or a [hash, tokens, kind] list."""
    where = f"segments[{i}]"
    if isinstance(item, list) and len(item) in (2, 3):
        item = dict(zip(("hash", "tokens", "kind"), item, strict=False))
    if not isinstance(item, dict):
        raise _fail(
            where,
            f"expected {{'hash', 'tokens', 'kind'}} or [hash, tokens, kind], got {_shown(item)}",
        )
    for key in item:
        if key not in ("hash", "tokens", "kind"):
            raise _fail(f"{where}.{key}", "unknown field; expected hash, tokens, kind")
    for key in ("hash", "tokens"):
        if key not in item:
            raise _fail(f"{where}.{key}", "missing")
    kind = item.get("kind", "user")
    if not isinstance(kind, str) or kind not in KIND_CODES:
        raise _fail(
            f"{where}.kind", f"expected one of {', '.join(SEGMENT_KINDS)}, got {_shown(kind)}"
        )
    return (
        _hash(item["hash"], f"{where}.hash"),
        _count(item["tokens"], f"{where}.tokens", 1),
        KIND_CODES[kind],
    )


def _row(raw: bytes) -> dict[str, Any]:
    """One line checked field by field; the values converted, or `_RowError`."""
    try:
        row = parse_json(raw)
    except UnicodeDecodeError as exc:
        raise _RowError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    except ValueError as exc:
        raise _RowError(f"not valid JSON: {exc}") from None
    if not isinstance(row, dict):
        raise _RowError(f"expected a JSON object, got {type(row).__name__}")
    for key in row:
        if key not in JSONL_FIELDS:
            raise _fail(key, f"unknown field; expected one of {', '.join(JSONL_FIELDS)}")
    for key in _REQUIRED:
        if key not in row:
            raise _fail(key, "missing")
    segments = row["segments"]
    if not isinstance(segments, list) or not segments:
        raise _fail("segments", f"expected a non-empty list of segments, got {_shown(segments)}")
    segs = [_segment(item, i) for i, item in enumerate(segments)]
    total = sum(tokens for _, tokens, _ in segs)
    if total > MAX_REQUEST_TOKENS:
        raise _fail("segments", f"{total:,} prompt tokens; expected at most {MAX_REQUEST_TOKENS:,}")
    if "input_tokens" in row and (
        type(row["input_tokens"]) is not int or row["input_tokens"] != total
    ):
        raise _fail(
            "input_tokens",
            f"expected the sum of segment tokens, {total}, got {_shown(row['input_tokens'])}",
        )
    session = row.get("session")
    if session is not None and not (
        (type(session) is int and 0 <= session < _SESSION_LIMIT)
        or (isinstance(session, str) and session)
    ):
        raise _fail(
            "session",
            f"expected an integer in [0, 2^63) or a non-empty string, got {_shown(session)}",
        )
    turn = row.get("turn")
    if turn is not None and (type(turn) is not int or not 0 <= turn < 2**31):
        raise _fail("turn", f"expected an integer in [0, 2^31), got {_shown(turn)}")
    think = row.get("think_time_s")
    category = row.get("category", "")
    if not isinstance(category, str) or len(category) > MAX_CATEGORY_CHARS:
        raise _fail(
            "category",
            f"expected a string of at most {MAX_CATEGORY_CHARS} characters, got {_shown(category)}",
        )
    wait = row.get("tool_wait_s")
    return {
        "arrival": _seconds(row["arrival_s"], "arrival_s"),
        "segments": segs,
        "output": _count(row["output_tokens"], "output_tokens", 1),
        "output_hash": _hash(row["output_hash"], "output_hash") if "output_hash" in row else 0,
        "session": session,
        "turn": turn,
        "think": math.nan if think is None else _seconds(think, "think_time_s"),
        "category": category,
        "tool_wait": math.nan if wait is None else _seconds(wait, "tool_wait_s"),
    }


def _session_ids(
    rows: list[dict[str, Any]], lines: list[int], shown: str, errors: RowErrors
) -> tuple[list[dict[str, Any]], list[int], np.ndarray]:
    """Canonical session ids: integers kept, strings numbered, the rest one session each."""
    kind = next((type(r["session"]) for r in rows if r["session"] is not None), int)
    keep = []
    for i, r in enumerate(rows):
        if r["session"] is not None and type(r["session"]) is not kind:
            mixed = f"{type(r['session']).__name__} and {kind.__name__}"
            errors.bad(f"{shown}:{lines[i]}: field 'session': {mixed} sessions in one file")
            continue
        keep.append(i)
    rows, lines = [rows[i] for i in keep], [lines[i] for i in keep]
    if kind is int:
        named = {r["session"] for r in rows if r["session"] is not None}
    else:
        codes: dict[str, int] = {}
        for r in rows:
            if r["session"] is not None:
                codes.setdefault(r["session"], len(codes))
        named = set(codes.values())
    fresh = _fresh_ids(named)
    ids = np.empty(len(rows), np.int64)
    for i, r in enumerate(rows):
        if r["session"] is None:
            ids[i] = next(fresh)
        else:
            ids[i] = r["session"] if kind is int else codes[r["session"]]
    return rows, lines, ids


def _fresh_ids(used: set[int]) -> Iterator[int]:
    """Session ids for rows without one: after the largest id in use, or, when that is the last
    id below 2^63, the unused ones counted up from 0 (there is always room: rows < 2^63)."""
    top = max(used, default=-1)
    start = top + 1 if top < _SESSION_LIMIT // 2 else 0
    return (i for i in itertools.count(start) if i not in used)


def _turns(arrival: np.ndarray, session: np.ndarray) -> np.ndarray:
    """Each row's place in its session, ordered by (arrival_s, line)."""
    n = arrival.size
    order = np.lexsort((np.arange(n), arrival, session))
    s_sorted = session[order]
    first = np.concatenate(([True], s_sorted[1:] != s_sorted[:-1])) if n else np.zeros(0, bool)
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    turn = np.empty(n, np.int64)
    turn[order] = np.arange(n) - start
    return turn


def read_jsonl(
    path: str | Path,
    *,
    name: str | None = None,
    shown: str | None = None,
    skip_bad_rows: bool = False,
) -> Chunked:
    """Read a kvsim JSONL trace (plain or gzip) as one chunk; errors name the file and line."""
    path = Path(path)
    shown = shown or str(path)
    errors = RowErrors(skip=skip_bad_rows)
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    for line_no, raw in iter_lines(path, shown):
        if not raw.strip():
            continue
        try:
            rows.append(_row(raw))
            lines.append(line_no)
        except _RowError as exc:
            errors.bad(f"{shown}:{line_no}: {exc}")
    rows, lines, session = _session_ids(rows, lines, shown, errors)
    arrival = np.array([r["arrival"] for r in rows], np.float64)
    turn = _turns(arrival, session)
    stated = np.array([-1 if r["turn"] is None else r["turn"] for r in rows], np.int64)
    wrong = (stated >= 0) & (stated != turn)
    for i in np.flatnonzero(wrong):
        errors.bad(
            f"{shown}:{lines[i]}: field 'turn': expected {turn[i]} (the row's place in "
            f"its session by arrival_s), got {stated[i]}"
        )
    if wrong.any():  # skipping: later turns of those sessions move up
        keep = ~wrong
        rows = [r for r, k in zip(rows, keep, strict=True) if k]
        arrival, session = arrival[keep], session[keep]
        turn = _turns(arrival, session)
    req = _requests(rows, arrival, session, turn)
    description = (
        f"kvsim JSONL trace {path.name}: arrivals, sessions, prompt segments and reply lengths "
        "as written"
    )

    def explain() -> str:
        skipped = f"all {errors.count:,} rows were malformed and skipped" if errors.count else ""
        return skipped or f"{shown} has no rows (one JSON object per line)"

    label = name or path.name.split(".")[0]
    return Chunked(iter([(req, np.inf)]), label, None, description, errors, explain)


def _requests(
    rows: list[dict[str, Any]], arrival: np.ndarray, session: np.ndarray, turn: np.ndarray
) -> Requests:
    counts = np.array([len(r["segments"]) for r in rows], np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    flat = [seg for r in rows for seg in r["segments"]]
    seg_tokens = np.array([t for _, t, _ in flat], np.int64)
    req = Requests(
        session_id=session,
        turn=turn,
        arrival_s=arrival,
        think_time_s=np.array([r["think"] for r in rows], np.float64),
        input_tokens=np.array([sum(t for _, t, _ in r["segments"]) for r in rows], np.int64),
        output_tokens=np.array([r["output"] for r in rows], np.int64),
        seg_offsets=offsets,
        seg_hashes=np.array([h for h, _, _ in flat], np.uint64),
        seg_tokens=seg_tokens,
        seg_kinds=np.array([k for _, _, k in flat], np.uint8),
        output_hash=np.array([r["output_hash"] for r in rows], np.uint64),
        category=np.array([r["category"] for r in rows], dtype=str),
        tool_wait_s=np.array([r["tool_wait"] for r in rows], np.float64),
    )
    req.follow_previous_turn()
    return req

"""qwen-bailian usage traces (JSONL) → canonical trace. All of it is real; nothing is drawn.

The public format of "KVCache Cache in the Wild" (Wang et al., USENIX ATC'25, arXiv 2506.02634;
github.com/alibaba-edu/qwen-bailian-usagetraces-anon, Apache-2.0): one JSON object per line,

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

with `timestamp` in seconds from the start of the trace, `parent_chat_id` -1 for a root request,
`type` one of text / search / image / file, and one anonymised hash id per 16-token block of the
prompt (the last block may be partial).

Mapping:
- `request_id` = `chat_id`; `parent_id` = `parent_chat_id`, or -1 when the parent is not in the
  file (or was skipped as malformed).
- Sessions are parent chains: a request with its parent in the file joins the parent's session;
  one without starts its own, whose `session_id` is its `chat_id`. `turn` is the request's place
  in its session by arrival (the file's own `turn` is checked for type, not trusted: the README's
  example counts from 1, and a chain cut by a missing parent restarts at 0 here).
- `category` = `type`; `arrival_s` = `timestamp` minus the earliest; `think_time_s` null (the
  real times replay open loop); `tool_wait_s` null (the trace says nothing of tool calls).
- Segments: one `opaque` segment per hash id, 16 tokens, the last holding the remainder; equal
  ids give equal segment hashes, so at block size 16 kvsim's block hashes follow the source's
  blocks one for one (kvsim chains them by prefix, so a block is reused only after an equal
  prefix, as a prefix cache would). `output_hash` 0: replies are not content-addressed.
- `output_length` 0 (a request that produced nothing) is kept with 1 output token: it still
  occupied a prefill.

Bad rows (a field missing, of the wrong type or negative, a `hash_ids` count other than
ceil(input_length / 16), a repeated `chat_id`, a request that follows itself or a parent that
arrives after it) are a one-line TraceError naming file, line and field, or with
`skip_bad_rows` are counted and left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.traces.blocks import mix
from kvsim.traces.common import RowErrors, iter_lines, json_object_row
from kvsim.traces.schema import (
    KIND_CODES,
    MAX_CATEGORY_CHARS,
    MAX_REQUEST_TOKENS,
    META_SKIPPED,
    Trace,
    make_trace_table,
)

__all__ = ["BAILIAN_BLOCK_TOKENS", "BAILIAN_FIELDS", "load_bailian"]

#: Tokens per hash id (the README: "16 tokens per block"; the files are named `*_blksz_16`).
BAILIAN_BLOCK_TOKENS = 16
BAILIAN_FIELDS = (
    "chat_id",
    "parent_chat_id",
    "timestamp",
    "input_length",
    "output_length",
    "type",
    "turn",
    "hash_ids",
)
#: Domain separator, so these ids never collide with another source's hashes by design.
_DOMAIN = np.uint64(0x4261696C69616E)  # "Bailian"
_ID_LIMIT = 2**63
#: Below float64's overflow, so an integer timestamp of any length cannot crash the conversion.
_MAX_SECONDS = 1e300


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(where: str, field: str, expected: str, value: object) -> str:
    return f"{where}: field {field!r}: expected {expected}, got {_shown(value)}"


def _is_int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high


def _check_row(raw: bytes, where: str) -> str | dict:
    """The row's checked values, or the one-line error message."""
    row = json_object_row(raw, where, BAILIAN_FIELDS)
    if isinstance(row, str):
        return row
    chat, parent, ts = row["chat_id"], row["parent_chat_id"], row["timestamp"]
    n_in, n_out, kind, hashes = (row["input_length"], row["output_length"], row["type"],
                                 row["hash_ids"])  # fmt: skip
    if not _is_int(chat, 0, _ID_LIMIT):
        return _bad(where, "chat_id", "an integer in [0, 2^63)", chat)
    if not _is_int(parent, -1, _ID_LIMIT):
        return _bad(where, "parent_chat_id", "a chat_id or -1 (a root request)", parent)
    if parent == chat:
        return _bad(where, "parent_chat_id", "another request's chat_id", parent)
    if type(ts) not in (int, float) or not (0 <= ts < _MAX_SECONDS):  # NaN fails here
        return _bad(where, "timestamp", "a non-negative number of seconds", ts)
    if not _is_int(n_in, 1, MAX_REQUEST_TOKENS + 1):
        return _bad(where, "input_length", f"an integer in [1, {MAX_REQUEST_TOKENS:,}]", n_in)
    if not _is_int(n_out, 0, MAX_REQUEST_TOKENS + 1):
        return _bad(where, "output_length", f"an integer in [0, {MAX_REQUEST_TOKENS:,}]", n_out)
    if not isinstance(kind, str) or len(kind) > MAX_CATEGORY_CHARS:
        return _bad(where, "type", f"a string of at most {MAX_CATEGORY_CHARS} characters", kind)
    if not _is_int(row["turn"], 0, 2**31):
        return _bad(where, "turn", "a non-negative integer", row["turn"])
    if type(hashes) is not list or not all(_is_int(h, 0, 2**64) for h in hashes):
        return _bad(where, "hash_ids", "a list of integers in [0, 2^64)", hashes)
    blocks = -(-n_in // BAILIAN_BLOCK_TOKENS)
    if len(hashes) != blocks:
        return _bad(where, "hash_ids",
                    f"ceil(input_length / {BAILIAN_BLOCK_TOKENS}) = {blocks} ids",
                    f"{len(hashes)} ids")  # fmt: skip
    return {"chat": chat, "parent": parent, "ts": float(ts), "in": n_in, "out": max(n_out, 1),
            "type": kind, "hashes": hashes}  # fmt: skip


def _parse(path: Path, shown: str, errors: RowErrors) -> tuple[list[dict], list[int]]:
    """Rows good on their own, with their line numbers; a repeated chat_id is bad after the
    first."""
    rows: list[dict] = []
    lines: list[int] = []
    seen: dict[int, int] = {}
    for line_no, raw in iter_lines(path, shown):
        if not raw.strip():
            continue
        where = f"{shown}:{line_no}"
        row = _check_row(raw, where)
        if isinstance(row, str):
            errors.bad(row)
            continue
        if row["chat"] in seen:
            errors.bad(_bad(where, "chat_id", f"a unique id (line {seen[row['chat']]} has it)",
                            row["chat"]))  # fmt: skip
            continue
        seen[row["chat"]] = line_no
        rows.append(row)
        lines.append(line_no)
    return rows, lines


def _sessions(
    rows: list[dict], lines: list[int], arrival: np.ndarray, shown: str, errors: RowErrors
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kept rows in canonical order, session, turn, parent) from the parent chains.

    Rows are walked in canonical order (arrival, chat_id), so a parent is always placed before
    its children and a chain cannot loop.
    """
    chat = np.array([r["chat"] for r in rows], np.int64)
    order = np.lexsort((chat, arrival))
    present = set(chat.tolist())  # rows good on their own, less those left out below
    placed: dict[int, int] = {}  # chat_id -> session, for rows kept so far
    turns: dict[int, int] = {}  # session -> turns so far
    kept, session, turn, parent = [], [], [], []
    for i in order.tolist():
        r = rows[i]
        p = r["parent"]
        if p in present and p not in placed:  # every earlier row is placed: it arrives later
            errors.bad(_bad(f"{shown}:{lines[i]}", "parent_chat_id",
                            "a request that arrives before this one", p))  # fmt: skip
            present.discard(r["chat"])  # its own children start sessions of their own
            continue
        if p in placed:
            s = placed[p]
        else:
            s, p = r["chat"], -1
        placed[r["chat"]] = s
        kept.append(i)
        session.append(s)
        turn.append(turns.get(s, 0))
        turns[s] = turn[-1] + 1
        parent.append(p)
    return (np.asarray(kept, np.int64), np.asarray(session, np.int64),
            np.asarray(turn, np.int64), np.asarray(parent, np.int64))  # fmt: skip


def load_bailian(
    path: str | Path,
    *,
    name: str | None = None,
    shown: str | None = None,
    errors: RowErrors | None = None,
) -> Trace:
    """Load a qwen-bailian JSONL file (plain or gzip) as a canonical Trace at its real times."""
    path = Path(path)
    shown = shown or str(path)
    errors = errors or RowErrors()
    rows, lines = _parse(path, shown, errors)
    if rows:
        ts = np.array([r["ts"] for r in rows], np.float64)
        kept, session, turn, parent = _sessions(rows, lines, ts - ts.min(), shown, errors)
    if not rows or not kept.size:
        reason = f": all {errors.count:,} rows were malformed and skipped" if errors.count else ""
        raise TraceError(f"{shown}: no requests{reason}")
    rows = [rows[i] for i in kept.tolist()]
    ts = ts[kept]
    n = len(rows)
    counts = np.fromiter((len(r["hashes"]) for r in rows), np.int64, n)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    flat = np.fromiter((h for r in rows for h in r["hashes"]), np.uint64, int(offsets[-1]))
    inputs = np.array([r["in"] for r in rows], np.int64)
    seg_tokens = np.full(flat.size, BAILIAN_BLOCK_TOKENS, np.int64)
    seg_tokens[offsets[1:] - 1] = inputs - BAILIAN_BLOCK_TOKENS * (counts - 1)
    categories = np.array([r["type"] for r in rows], dtype=str)
    label = name or path.name.split(".")[0]
    types = ", ".join(f"{t} {c:,}" for t, c in zip(*np.unique(categories, return_counts=True),
                                                      strict=True))  # fmt: skip
    table = make_trace_table(
        request_id=np.array([r["chat"] for r in rows], np.int64),
        session_id=session,
        turn=turn.astype(np.int32),
        arrival_s=ts - ts.min(),
        think_time_s=None,
        input_tokens=inputs,
        output_tokens=np.array([r["out"] for r in rows], np.int64),
        seg_offsets=offsets,
        seg_hashes=mix(_DOMAIN, flat + np.uint64(1), np.zeros(1, np.uint64)),
        seg_tokens=seg_tokens,
        seg_kinds=np.full(flat.size, KIND_CODES["opaque"], np.uint8),
        output_hash=np.zeros(n, np.uint64),
        name=label,
        native_block_size=BAILIAN_BLOCK_TOKENS,
        description=(
            f"qwen-bailian trace {path.name}: real arrivals, token counts, "
            f"{BAILIAN_BLOCK_TOKENS}-token block ids, sessions from parent chats "
            f"({np.unique(session).size:,}) and request types ({types})"
        ),
        parent_id=parent,
        category=categories,
    )
    if errors.count:
        meta = dict(table.schema.metadata or {})
        meta[META_SKIPPED] = str(errors.count).encode()
        table = table.replace_schema_metadata(meta)
    return Trace.from_table(table, shown)

"""Dynamo agent request traces (`dynamo.request.trace.v1` JSONL, optionally gzip) → canonical.

Each line is `{"timestamp": ms, "event": {...}}`. `request_end` events are model calls: real token
counts, the time the request was received, and `replay.input_sequence_hashes`, one chained hash per
`trace_block_size` (16) tokens of the prompt, the last block partial. Each hash becomes one segment
of that many tokens (the last holds the remainder), so at the native block size kvsim's block
hashes match the source's blocks one for one. Tool events (`tool_start`/`tool_end`/`tool_error`)
carry durations; a session's later calls are closed-loop, issued `think_time_s` after the previous
call ended, where think time is the measured gap (tool execution, including a subagent tool's whole
run, plus harness overhead). Subagents (`parent_session_id`) are sessions of their own; their
prompts share the root's prefix blocks through the real hashes; the description lists the links.
Replies are not content-addressed in this format (`output_hash` 0).

Hints: category 'agent'. A later call's parent is the call before it in its session; a subagent's
first call's parent is the last call of its parent session that ended before it started (the call
whose tool started the subagent). A call whose session logs a tool event between its end and the
session's next call is a tool call: `tool_wait_s` 0 (the trace records durations only after the
fact, and using them would show the future).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.textio import parse_json
from kvsim.traces.blocks import mix
from kvsim.traces.common import Chunked, Requests, RowErrors, iter_lines
from kvsim.traces.schema import KIND_CODES, MAX_REQUEST_TOKENS

__all__ = ["DYNAMO_SCHEMA", "read_dynamo"]

DYNAMO_SCHEMA = "dynamo.request.trace.v1"
_DOMAIN = np.uint64(0x44796E616D6F)  # "Dynamo"
_TOOL_EVENTS = ("tool_start", "tool_end", "tool_error")


def _table(value: object) -> dict:
    """A JSON object, or {} for anything else (a missing or mistyped optional sub-object)."""
    return value if isinstance(value, dict) else {}


def _num(value: object) -> bool:
    """A finite JSON number small enough for float64 (a 400-digit integer is not)."""
    return type(value) in (int, float) and value == value and abs(value) < 1e300


def read_dynamo(
    path: str | Path, *, name: str | None = None, shown: str | None = None,
    skip_bad_rows: bool = False,
) -> Chunked:  # fmt: skip
    """Read a Dynamo request-trace file as one chunk (agent traces are small)."""
    path = Path(path)
    shown = shown or str(path)
    errors = RowErrors(skip=skip_bad_rows)
    rows: list[dict] = []
    tools: dict[str, list[float]] = {}
    tool_times: dict[str, list[float]] = {}  # when each session logged a tool event, ms
    parents: dict[str, str] = {}
    block: int | None = None
    for line_no, raw in iter_lines(path, shown):
        if not raw.strip():
            continue
        where = f"{shown}:{line_no}"
        try:
            rec = parse_json(raw)
        except UnicodeDecodeError as exc:
            errors.bad(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x})")
            continue
        except ValueError as exc:
            errors.bad(f"{where}: not valid JSON: {exc}")
            continue
        event = rec.get("event") if isinstance(rec, dict) else None
        if not isinstance(event, dict):
            errors.bad(f"{where}: field 'event': missing")
            continue
        ts = rec.get("timestamp")
        if not _num(ts) or ts < 0:
            errors.bad(f"{where}: field 'timestamp': expected a non-negative number, got {ts!r}")
            continue
        ctx = _table(event.get("agent_context"))
        session = ctx.get("session_id")
        if not isinstance(session, str):
            errors.bad(f"{where}: field 'agent_context.session_id': missing")
            continue
        if isinstance(ctx.get("parent_session_id"), str):
            parents[session] = ctx["parent_session_id"]
        kind = event.get("event_type")
        if kind in _TOOL_EVENTS:
            tool_times.setdefault(session, []).append(float(ts))
            tool = _table(event.get("tool"))
            if kind != "tool_start" and _num(tool.get("duration_ms")):
                tools.setdefault(session, []).append(float(tool["duration_ms"]))
            continue
        if kind != "request_end":
            continue
        req = event.get("request")
        if not isinstance(req, dict):
            errors.bad(f"{where}: field 'request': missing")
            continue
        replay = _table(req.get("replay"))
        n_in, n_out = req.get("input_tokens"), req.get("output_tokens")
        hashes = replay.get("input_sequence_hashes")
        size = replay.get("trace_block_size")
        problem = None
        if type(n_in) is not int or n_in < 1:
            problem = (
                "field 'request.input_tokens': expected a positive integer (a prompt of >= 1 "
                f"token), got {n_in!r}"
            )
        elif type(n_out) is not int or n_out < 0:
            problem = (
                f"field 'request.output_tokens': expected a non-negative integer, got {n_out!r}"
            )
        elif max(n_in, n_out) > MAX_REQUEST_TOKENS:
            field = "input_tokens" if n_in > MAX_REQUEST_TOKENS else "output_tokens"
            problem = (
                f"field 'request.{field}': expected at most {MAX_REQUEST_TOKENS:,} tokens, "
                f"got {max(n_in, n_out)!r}"
            )
        elif type(size) is not int or size < 1:
            problem = f"field 'replay.trace_block_size': expected a positive integer, got {size!r}"
        elif block is not None and size != block:
            problem = f"field 'replay.trace_block_size': {size} differs from earlier rows' {block}"
        elif type(hashes) is not list or not all(type(h) is int and 0 <= h < 2**64 for h in hashes):
            problem = (
                "field 'replay.input_sequence_hashes': expected a list of integers in [0, 2^64)"
            )
        elif len(hashes) != -(-n_in // size):
            problem = (
                f"field 'replay.input_sequence_hashes': expected ceil(input_tokens / "
                f"{size}) = {-(-n_in // size)} hashes, got {len(hashes)}"
            )
        if problem:
            errors.bad(f"{where}: {problem}")
            continue
        block = size
        received = req.get("request_received_ms")
        event_ms = event.get("event_time_unix_ms")
        total = req.get("total_time_ms")
        if _num(received) and _num(event_ms):
            start_ms = ts - (event_ms - received)
        elif _num(total):
            start_ms = ts - total
        else:
            start_ms = ts
        rows.append({"session": session, "start": start_ms, "end": ts, "in": n_in,
                     "out": max(n_out, 1), "hashes": hashes})  # fmt: skip
    if not rows:
        skipped = f" ({errors.count:,} malformed rows skipped)" if errors.count else ""
        raise TraceError(f"{shown}: no requests: no valid request_end events{skipped}")
    rows.sort(key=lambda r: (r["start"], r["end"]))
    names: dict[str, int] = {}
    last_end: dict[str, float] = {}
    turns: dict[str, int] = {}
    n = len(rows)
    session = np.empty(n, np.int64)
    turn = np.empty(n, np.int64)
    arrival = np.empty(n)
    think = np.full(n, np.nan)
    t0 = rows[0]["start"]
    for i, r in enumerate(rows):
        s = r["session"]
        session[i] = names.setdefault(s, len(names))
        turn[i] = turns.get(s, 0)
        turns[s] = turn[i] + 1
        arrival[i] = (r["start"] - t0) / 1000.0
        if turn[i] > 0:
            think[i] = max(0.0, (r["start"] - last_end[s]) / 1000.0)
        last_end[s] = r["end"]
    counts = np.array([len(r["hashes"]) for r in rows], np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    flat = np.fromiter((h for r in rows for h in r["hashes"]), np.uint64, int(offsets[-1]))
    inputs = np.array([r["in"] for r in rows], np.int64)
    seg_tokens = np.full(flat.size, block, np.int64)
    has = counts > 0
    seg_tokens[offsets[1:][has] - 1] = inputs[has] - block * (counts[has] - 1)
    parent_session, parent_turn, tool_call = _hints(rows, session, turn, names, parents,
                                                    tool_times)  # fmt: skip
    req = Requests(
        session_id=session, turn=turn, arrival_s=arrival, think_time_s=think,
        input_tokens=inputs, output_tokens=np.array([r["out"] for r in rows], np.int64),
        seg_offsets=offsets, seg_hashes=mix(_DOMAIN, flat, np.zeros(1, np.uint64)),
        seg_tokens=seg_tokens, seg_kinds=np.full(flat.size, KIND_CODES["opaque"], np.uint8),
        output_hash=np.zeros(n, np.uint64), parent_session=parent_session,
        parent_turn=parent_turn, category=np.full(n, "agent"),
        tool_wait_s=np.where(tool_call, 0.0, np.nan),
    )  # fmt: skip
    n_tools = sum(len(v) for v in tools.values())
    links = "; ".join(f"{k} <- {v}" for k, v in sorted(parents.items()))
    description = (
        f"Dynamo agent trace {path.name}: real calls, token counts, {block}-token prefix hashes, "
        f"arrivals and tool gaps ({n_tools} tool calls) as think time; "
        f"{len(names)} sessions" + (f" (subagent <- parent: {links})" if links else "")
    )
    return Chunked(iter([(req, np.inf)]), name or path.name.split(".")[0], block, description,
                   errors)  # fmt: skip


def _hints(
    rows: list[dict],
    session: np.ndarray,
    turn: np.ndarray,
    names: dict[str, int],
    parents: dict[str, str],
    tool_times: dict[str, list[float]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parent session, parent turn, is a tool call) per row; rows sorted by start.

    Why the rules (module docstring): the trace says which session spawned which, not which call,
    so the spawning call is the parent session's last call that ended before the subagent began.
    """
    n = len(rows)
    p_session = np.where(turn > 0, session, -1).astype(np.int64)
    p_turn = np.where(turn > 0, turn - 1, -1).astype(np.int64)
    tool_call = np.zeros(n, bool)
    by_session: dict[int, list[int]] = {}
    for i in range(n):
        by_session.setdefault(int(session[i]), []).append(i)
    for name, code in names.items():
        mine = by_session[code]
        times = np.sort(np.asarray(tool_times.get(name, []), np.float64))
        for k, i in enumerate(mine):
            end = rows[i]["end"]
            upto = rows[mine[k + 1]]["start"] if k + 1 < len(mine) else np.inf
            lo = np.searchsorted(times, end, side="left")
            tool_call[i] = lo < times.size and times[lo] < upto
        parent = parents.get(name)
        if parent is None or parent not in names:
            continue
        first = rows[mine[0]]["start"]
        done = [j for j in by_session[names[parent]] if rows[j]["end"] <= first]
        if done:
            j = max(done, key=lambda j: (rows[j]["end"], j))
            p_session[mine[0]], p_turn[mine[0]] = session[j], turn[j]
    return p_session, p_turn, tool_call

"""SWE-agent `.traj` trajectories → canonical: each model call re-sends the growing history.

A `.traj` file is JSON with `history` (the chat messages, `role` in system/user/assistant/tool)
and `trajectory` (one step per model call, with `execution_time` of the tool run in newer files).
Every assistant message is a call whose prompt is every message before it: system prompt, task and
demonstration, earlier actions and observations. Observations are the `tool` role in
function-calling files, and `user` messages after the first call in older files; both become
`tool` segments. Segment hashes are content hashes, so the re-sent history is shared KV.

Real: the call structure and text (token counts: `kvsim.traces.text`). Drawn or assumed: there are
no wall-clock times, so the session starts at 0 (files after the first: see `read_swe_agent`) and
the think time before call k+1 is step k's `execution_time` when the file has it, else 0 (the next
call issues as soon as the previous reply ends).

Hints: category 'agent'; each later call follows the call before it; a reply is a tool call,
`tool_wait_s` 0, when it records an `action` or `tool_calls` (what a server knows once the reply
is decoded; issue 45): so the final `submit`, whose session ends, is one too. Files without those
fields fall back to "an observation follows". The file holds no expected duration, and its
`execution_time` is the observed gap, which would show the future.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from kvsim.errors import TraceError
from kvsim.traces.common import (
    ChatMessages,
    Chunked,
    RowErrors,
    chat_requests,
    closed_loop_times,
    drop_oversized_sessions,
    read_json,
)
from kvsim.traces.schema import KIND_CODES
from kvsim.traces.text import TokenCounter, content_hashes

__all__ = ["read_swe_agent"]

_ROLES = ("system", "user", "assistant", "tool")


def _text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def _recorded_tool_call(msg: dict) -> int:
    """1 if the reply carries an action or a function call (a tool call, known when it was
    decoded), 0 if it records neither, -1 if the file does not say (no such field)."""
    if "action" not in msg and "tool_calls" not in msg:
        return -1
    action = msg.get("action")
    return int(bool(msg.get("tool_calls")) or (isinstance(action, str) and bool(action.strip())))


def _parse(
    path: Path, shown: str, errors: RowErrors
) -> tuple[list[int], list[str], list[float], list[int]]:
    """(kinds, texts, each step's execution time, each message's recorded tool call)."""
    data = read_json(path, shown)
    history = data.get("history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise TraceError(f"{shown}: field 'history': missing or not a list")
    kinds: list[int] = []
    texts: list[str] = []
    tool_call: list[int] = []
    called = False
    for i, msg in enumerate(history):
        role = msg.get("role") if isinstance(msg, dict) else None
        text = _text(msg.get("content")) if isinstance(msg, dict) else None
        if role not in _ROLES:
            errors.bad(f"{shown}: history item {i}: field 'role': unknown role {role!r}; "
                       f"valid: {', '.join(_ROLES)}")  # fmt: skip
            continue
        if text is None:
            errors.bad(f"{shown}: history item {i}: field 'content': expected text")
            continue
        if role == "assistant":
            kind, called = "assistant", True
        elif role == "tool" or (role == "user" and called):
            kind = "tool"
        else:
            kind = role
        kinds.append(KIND_CODES[kind])
        texts.append(text)
        tool_call.append(_recorded_tool_call(msg) if kind == "assistant" else -1)
    steps = data.get("trajectory") if isinstance(data.get("trajectory"), list) else []
    exec_s = [
        float(s["execution_time"]) if isinstance(s, dict) and type(s.get("execution_time")) in
        (int, float) and s["execution_time"] >= 0 else np.nan
        for s in steps
    ]  # fmt: skip
    return kinds, texts, exec_s, tool_call


def read_swe_agent(
    paths: str | Path | list[Path],
    *,
    name: str | None = None,
    counter: TokenCounter | None = None,
    session_gap_s: float = 0.0,
    skip_bad_rows: bool = False,
) -> Chunked:
    """Read one `.traj` file, or several (a directory), one session each.

    Sessions start `session_gap_s` apart in file-name order (0: all at once).
    """
    paths = [Path(paths)] if isinstance(paths, str | Path) else list(paths)
    if len(paths) == 1 and paths[0].is_dir():
        folder = paths[0]
        paths = sorted(folder.glob("*.traj"))
        if not paths:
            raise TraceError(f"{folder}: no .traj files")
    counter = counter or TokenCounter()
    errors = RowErrors(skip=skip_bad_rows)
    offsets, kinds, texts, exec_all, tool_call = [0], [], [], [], []
    for path in paths:
        k, t, e, c = _parse(path, str(path), errors)
        kinds += k
        texts += t
        tool_call += c
        offsets.append(len(kinds))
        exec_all.append(e)
    text_arr = pa.array(texts, pa.string())
    kind_arr = np.asarray(kinds, np.uint8)
    msgs = ChatMessages(np.asarray(offsets, np.int64), kind_arr, counter.count(text_arr),
                        content_hashes(text_arr, kind_arr))  # fmt: skip
    req = chat_requests(msgs, np.arange(len(paths)), category="agent",
                        recorded_tool_call=np.asarray(tool_call, np.int8))  # fmt: skip
    req = drop_oversized_sessions(req, errors, lambda session: str(paths[session]))
    think = np.zeros(len(req))
    for i in np.flatnonzero(req.turn > 0):
        steps = exec_all[req.session_id[i]]
        k = int(req.turn[i]) - 1  # the tool run after call k precedes call k + 1
        if k < len(steps) and np.isfinite(steps[k]):
            think[i] = steps[k]
    closed_loop_times(req, req.session_id * session_gap_s, think)
    if not len(req):
        raise TraceError(f"{paths[0]}: no model calls (no assistant message after a prompt)")
    has_exec = any(np.isfinite(e).any() for e in exec_all if e)
    description = (
        f"SWE-agent trajectories ({', '.join(p.name for p in paths)}): real call structure and "
        f"text lengths (tokens: {counter.name}); no wall-clock times; think time = "
        + ("the steps' tool execution_time" if has_exec else "0 (not recorded)")
    )
    label = name or (paths[0].stem if len(paths) == 1 else paths[0].parent.name)
    return Chunked(iter([(req, np.inf)]), label, None, description, errors)

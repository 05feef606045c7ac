"""Pieces every loader shares: bad-row handling, request columns, the chat-history builder.

Loaders produce `Requests` chunks (flat numpy columns, unsorted, request ids not yet assigned);
`to_table` turns them into the canonical table, and `kvsim.traces.convert` streams them to Parquet
in arrival order without holding the whole trace.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from kvsim.errors import TraceError
from kvsim.textio import parse_json, read_utf8
from kvsim.traces.schema import KIND_CODES, MAX_REQUEST_TOKENS, make_trace_table
from kvsim.traces.toolhint import draw_tool_hints

__all__ = [
    "ChatMessages",
    "Chunked",
    "RequestIds",
    "Requests",
    "RowErrors",
    "chat_requests",
    "closed_loop_times",
    "drop_oversized_sessions",
    "iter_lines",
    "read_json",
]


def json_object_row(raw: bytes, where: str, fields: Iterable[str]) -> dict | str:
    """A JSON-lines row as a dict holding every one of `fields`, or the one-line message
    saying what is wrong with it (not UTF-8, not JSON, not an object, a field missing)."""
    try:
        row = parse_json(raw)
    except UnicodeDecodeError as exc:
        return f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x})"
    except ValueError as exc:
        return f"{where}: not valid JSON: {exc}"
    if not isinstance(row, dict):
        return f"{where}: expected a JSON object, got {type(row).__name__}"
    for name in fields:
        if name not in row:
            return f"{where}: field {name!r}: missing"
    return row


def iter_lines(path: Path, shown: str) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes) of each line of a text file, gzip-compressed or not.

    Opening or reading problems (permission, a directory, a corrupt or truncated gzip stream)
    become a one-line TraceError naming the file and, when reading, the line reached.
    """
    try:
        with path.open("rb") as probe:
            magic = probe.read(2)
        handle = gzip.open(path, "rb") if magic == b"\x1f\x8b" else path.open("rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise TraceError(f"{shown}: cannot open: {exc.strerror or exc}") from None
    line_no = 0
    with handle:
        try:
            for line_no, raw in enumerate(handle, start=1):
                yield line_no, raw
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{shown}:{line_no + 1}: cannot read: {exc}") from None


def read_json(path: Path, shown: str) -> object:
    """A whole JSON document, or a one-line TraceError naming the file (and line if known)."""
    text = read_utf8(path, shown, TraceError)
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{shown}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:  # e.g. a number too long to convert
        raise TraceError(f"{shown}: not valid JSON: {exc}") from None


@dataclass
class RowErrors:
    """Bad-row policy: raise a one-line TraceError, or (with `skip`) count and go on."""

    skip: bool = False
    count: int = 0
    first: str | None = None

    def bad(self, message: str) -> None:
        if not self.skip:
            raise TraceError(message)
        self.count += 1
        if self.first is None:
            self.first = message


def _i64(values: Iterable | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


#: Per-row columns of `Requests` (segment columns aside), in the order `concat` joins them.
_ROW_FIELDS = (
    "session_id", "turn", "arrival_s", "think_time_s", "input_tokens", "output_tokens",
    "output_hash", "parent_session", "parent_turn", "category", "tool_wait_s",
)  # fmt: skip
_KEY = np.dtype([("session", np.int64), ("turn", np.int64)])


def _keys(session: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """(session, turn) pairs as one sortable, searchable array."""
    keys = np.empty(np.asarray(session).size, _KEY)
    keys["session"], keys["turn"] = session, turn
    return keys


@dataclass
class Requests:
    """Requests as flat columns; `seg_offsets` delimits each row's segments (rows + 1 entries).

    Request ids do not exist yet, so a row names its parent (the call it follows) by the parent's
    (`parent_session`, `parent_turn`); -1 = none. `to_table` turns that into `parent_id`. The
    parent must be in the same chunk as the row (or an earlier one still pending in a streaming
    conversion); every source here yields whole sessions with their spawners. The hint columns
    may be left out (None): no parent, category '', no tool call.
    """

    session_id: np.ndarray
    turn: np.ndarray
    arrival_s: np.ndarray
    think_time_s: np.ndarray  # NaN = null
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    seg_offsets: np.ndarray
    seg_hashes: np.ndarray
    seg_tokens: np.ndarray
    seg_kinds: np.ndarray
    output_hash: np.ndarray
    parent_session: np.ndarray | None = None  # -1 = no parent
    parent_turn: np.ndarray | None = None  # -1 = no parent
    category: np.ndarray | None = None  # str per row ('' = unknown)
    tool_wait_s: np.ndarray | None = None  # NaN = null (the reply is not a tool call)

    def __post_init__(self) -> None:
        n = len(self)
        if self.parent_session is None:
            self.parent_session = np.full(n, -1, np.int64)
        if self.parent_turn is None:
            self.parent_turn = np.full(n, -1, np.int64)
        if self.category is None:
            self.category = np.full(n, "", dtype="<U1")
        if self.tool_wait_s is None:
            self.tool_wait_s = np.full(n, np.nan)

    def __len__(self) -> int:
        return int(self.session_id.size)

    @classmethod
    def empty(cls) -> Requests:
        z = np.zeros(0, np.int64)
        return cls(z, z, np.zeros(0), np.zeros(0), z, z, np.zeros(1, np.int64), z.astype(np.uint64),
                   z, z.astype(np.uint8), z.astype(np.uint64))  # fmt: skip

    def follow_previous_turn(self) -> None:
        """Set each later turn's parent to the turn before it in its session (in place)."""
        later = self.turn > 0
        self.parent_session = np.where(later, self.session_id, -1).astype(np.int64)
        self.parent_turn = np.where(later, self.turn - 1, -1).astype(np.int64)

    @classmethod
    def concat(cls, parts: list[Requests]) -> Requests:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0] + [int(p.seg_offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate(
            [[0]] + [p.seg_offsets[1:] + s for p, s in zip(parts, shift, strict=True)]
        )
        cat = {
            name: np.concatenate([getattr(p, name) for p in parts])
            for name in (*_ROW_FIELDS, "seg_hashes", "seg_tokens", "seg_kinds")
        }
        return cls(seg_offsets=offsets.astype(np.int64), **cat)

    def take(self, rows: np.ndarray) -> Requests:
        """The given rows (a boolean mask or indices), segments included."""
        rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, np.int64)
        counts = np.diff(self.seg_offsets)[rows]
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        src = np.repeat(self.seg_offsets[rows] - offsets[:-1], counts) + np.arange(offsets[-1])
        return Requests(
            seg_offsets=offsets, seg_hashes=self.seg_hashes[src], seg_tokens=self.seg_tokens[src],
            seg_kinds=self.seg_kinds[src], **{k: getattr(self, k)[rows] for k in _ROW_FIELDS},
        )  # fmt: skip

    def order(self) -> np.ndarray:
        """Canonical row order: arrival, then session, then turn (so ids keep turns in order)."""
        return np.lexsort((self.turn, self.session_id, self.arrival_s))

    def to_table(
        self,
        *,
        name: str,
        native_block_size: int | None,
        description: str,
        first_id: int = 0,
        earlier: RequestIds | None = None,
    ) -> pa.Table:
        """Canonical table; request ids are assigned in canonical order starting at `first_id`.

        Parents resolve among these rows, then among `earlier` (rows already written by a
        streaming conversion); one found in neither is -1.
        """
        n = len(self)
        request_id = np.empty(n, np.int64)
        request_id[self.order()] = np.arange(first_id, first_id + n)
        parent = self._parent_ids(request_id, earlier)
        return make_trace_table(
            request_id=request_id,
            session_id=self.session_id,
            turn=self.turn.astype(np.int32),
            arrival_s=self.arrival_s,
            think_time_s=self.think_time_s,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            seg_offsets=self.seg_offsets,
            seg_hashes=self.seg_hashes,
            seg_tokens=self.seg_tokens,
            seg_kinds=self.seg_kinds,
            output_hash=self.output_hash,
            name=name,
            native_block_size=native_block_size,
            description=description,
            parent_id=parent,
            category=self.category,
            tool_wait_s=self.tool_wait_s,
        )

    def _parent_ids(self, request_id: np.ndarray, earlier: RequestIds | None) -> np.ndarray:
        """`parent_id` per row: the previous turn by position in (session, turn) order (most
        parents, no search), the rest searched among these rows and then `earlier`."""
        own = RequestIds()
        own.add(self.session_id, self.turn, request_id)
        prev = np.maximum(own.rank - 1, 0)
        follows = (
            (self.parent_turn >= 0)
            & (self.parent_session == self.session_id)
            & (self.parent_turn == self.turn - 1)
            & (own.rank > 0)
            & (own._session[prev] == self.session_id)
            & (own._turn[prev] == self.turn - 1)
        )
        parent = np.where(follows, own._ids[prev], -1)
        rest = np.flatnonzero(~follows & (self.parent_turn >= 0))
        if rest.size:
            parent[rest] = own.find(self.parent_session[rest], self.parent_turn[rest])
            missing = rest[parent[rest] < 0]
            if earlier is not None and missing.size:
                parent[missing] = earlier.find(
                    self.parent_session[missing], self.parent_turn[missing]
                )
        return parent


class RequestIds:
    """Request ids by (session, turn): how a row's parent key becomes the parent's `request_id`.

    Kept sorted by (session, turn) and searched with `searchsorted`, so a lookup costs no Python
    loop per row. Keys pack into one int64 when sessions are in [0, 2^32) (every built-in
    source); other sessions fall back to a slower two-field search.
    """

    def __init__(self) -> None:
        self._session = np.zeros(0, np.int64)
        self._turn = np.zeros(0, np.int64)
        self._ids = np.zeros(0, np.int64)
        #: After `add`: where each added row went in the sorted keys (in the order it was given).
        self.rank = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return int(self._ids.size)

    def add(self, session: np.ndarray, turn: np.ndarray, ids: np.ndarray) -> None:
        had = self._ids.size
        session = np.concatenate([self._session, np.asarray(session, np.int64)])
        turn = np.concatenate([self._turn, np.asarray(turn, np.int64)])
        ids = np.concatenate([self._ids, np.asarray(ids, np.int64)])
        order = np.lexsort((turn, session))
        self._session, self._turn, self._ids = session[order], turn[order], ids[order]
        rank = np.empty(order.size, np.int64)
        rank[order] = np.arange(order.size)
        self.rank = rank[had:]

    def _positions(self, session: np.ndarray, turn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into the sorted keys, whether the key is there) for each query."""
        session, turn = np.asarray(session, np.int64), np.asarray(turn, np.int64)
        if _packs(self._session) and _packs(session):
            mine, query = _pack(self._session, self._turn), _pack(session, turn)
        else:
            mine, query = _keys(self._session, self._turn), _keys(session, turn)
        pos = np.minimum(np.searchsorted(mine, query), self._ids.size - 1)
        return pos, (mine[pos] == query) & (turn >= 0)

    def find(self, session: np.ndarray, turn: np.ndarray) -> np.ndarray:
        """The id of each (session, turn); -1 where absent (and where `turn` is -1)."""
        out = np.full(np.asarray(session).size, -1, np.int64)
        if not self._ids.size or not out.size:
            return out
        pos, hit = self._positions(session, turn)
        out[hit] = self._ids[pos[hit]]
        return out

    def keep(self, session: np.ndarray, turn: np.ndarray) -> None:
        """Forget every entry but these keys (the parents rows still to be written name)."""
        if not self._ids.size:
            return
        pos, hit = self._positions(session, turn)
        rows = np.unique(pos[hit])
        self._session, self._turn = self._session[rows], self._turn[rows]
        self._ids = self._ids[rows]


def _packs(session: np.ndarray) -> bool:
    return not session.size or (int(session.min()) >= 0 and int(session.max()) < 2**32)


def _pack(session: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """session * 2^31 + turn: ordered as (session, turn) for turns in [-1, 2^31)."""
    return (session << 31) + turn


@dataclass
class Chunked:
    """A source read as a stream of `Requests` chunks.

    After each chunk, `frontier` is a time such that every row of every later chunk arrives at or
    after it; the streaming writer emits rows earlier than the frontier and holds the rest.
    """

    chunks: Iterator[tuple[Requests, float]]
    name: str
    native_block_size: int | None
    description: str
    errors: RowErrors = field(default_factory=RowErrors)
    #: Called after the chunks are spent when they held no request: says why, in one line.
    explain_empty: Callable[[], str] | None = None

    def no_requests(self) -> TraceError:
        """The error for a source that yielded nothing, with the reason when the reader knows it."""
        reason = self.explain_empty() if self.explain_empty else None
        if reason is None and self.errors.count:
            reason = f"all {self.errors.count:,} rows were malformed and skipped"
        return TraceError(f"{self.name}: no requests" + (f": {reason}" if reason else ""))


@dataclass
class ChatMessages:
    """Messages of many conversations, flat: conversation `c` owns `offsets[c]:offsets[c+1]`.

    `kinds` are segment kind codes; an `assistant` message is a model call whose prompt is every
    earlier message of its conversation and whose reply is the message itself.
    """

    offsets: np.ndarray
    kinds: np.ndarray
    tokens: np.ndarray
    hashes: np.ndarray


def chat_requests(
    msgs: ChatMessages,
    session_ids: np.ndarray,
    category: str = "",
    tool_wait_s: float = 0.0,
    *,
    hint_rng: np.random.Generator | None = None,
    recorded_tool_call: np.ndarray | None = None,
) -> Requests:
    """One request per assistant message that has a prompt before it (vectorised, no row loop).

    Non-reply messages with 0 tokens are dropped; a reply counts at least 1 token, and the same
    (hash, tokens) segment reappears in later prompts, so the next call reuses its KV. Times are
    left at 0 / NaN: the caller fills them (`closed_loop_times`, or real timestamps).

    Hints: every row gets `category`; a later call follows the call before it in its
    conversation; a tool call gets `tool_wait_s` (0: its duration is unknown; a generator passes
    its tool-latency mean), the others null. Which replies are tool calls (issue 45: never simply
    "the session continues", which would tell a policy the future):
    - `recorded_tool_call` (per message; 1 yes, 0 no, -1 not recorded): what the source recorded
      of the reply itself, known when it was decoded (SWE-agent's `action`);
    - else `hint_rng`: drawn from the truth by `kvsim.traces.toolhint` (generators);
    - else, and for -1 above, a reply followed by a `tool` message (a source whose abandoned
      calls are not recorded; chat sources have no tool messages, so no tool calls).
    """
    kinds = np.asarray(msgs.kinds, np.uint8)
    tokens = _i64(msgs.tokens)
    hashes = np.asarray(msgs.hashes, np.uint64)
    n_conv = msgs.offsets.size - 1
    conv = np.repeat(np.arange(n_conv, dtype=np.int64), np.diff(msgs.offsets))
    is_reply = kinds == KIND_CODES["assistant"]
    keep = is_reply | (tokens > 0)
    tokens = np.where(is_reply, np.maximum(tokens, 1), tokens)
    kinds, tokens, hashes, conv = kinds[keep], tokens[keep], hashes[keep], conv[keep]
    is_reply = is_reply[keep]
    start = np.searchsorted(conv, np.arange(n_conv), side="left")
    pos = np.arange(conv.size, dtype=np.int64)
    calls = np.flatnonzero(is_reply & (pos > start[conv]))
    call_conv = conv[calls]
    counts = calls - start[call_conv]
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    src = np.repeat(start[call_conv] - offsets[:-1], counts) + np.arange(offsets[-1])
    seg_tokens = tokens[src]
    input_tokens = np.add.reduceat(seg_tokens, offsets[:-1]) if calls.size else _i64([])
    first_call = np.concatenate(([True], call_conv[1:] != call_conv[:-1])) if calls.size else calls
    group = np.maximum.accumulate(np.where(first_call, np.arange(calls.size), 0))
    turn = np.arange(calls.size, dtype=np.int64) - group
    after = np.minimum(calls + 1, max(conv.size - 1, 0))
    continues = (
        (calls + 1 < conv.size) & (conv[after] == call_conv) & (kinds[after] == KIND_CODES["tool"])
        if calls.size
        else np.zeros(0, bool)
    )
    is_tool_call = _tool_calls(continues, call_conv, hint_rng, recorded_tool_call, keep, calls)
    session = _i64(session_ids)[call_conv]
    req = Requests(
        session_id=session,
        turn=turn,
        arrival_s=np.zeros(calls.size),
        think_time_s=np.full(calls.size, np.nan),
        input_tokens=_i64(input_tokens),
        output_tokens=tokens[calls],
        seg_offsets=offsets,
        seg_hashes=hashes[src],
        seg_tokens=seg_tokens,
        seg_kinds=kinds[src],
        output_hash=hashes[calls],
        category=np.full(calls.size, category),
        tool_wait_s=np.where(is_tool_call, tool_wait_s, np.nan),
    )
    req.follow_previous_turn()
    return req


def _tool_calls(
    continues: np.ndarray,
    call_conv: np.ndarray,
    rng: np.random.Generator | None,
    recorded: np.ndarray | None,
    keep: np.ndarray,
    calls: np.ndarray,
) -> np.ndarray:
    """Which calls' replies are hinted as tool calls (`chat_requests`' rules, in order)."""
    if recorded is not None:
        known = np.asarray(recorded, np.int8)[keep][calls]
        return np.where(known >= 0, known == 1, continues)
    if rng is not None:
        return draw_tool_hints(continues, call_conv, rng)
    return continues


def closed_loop_times(
    req: Requests,
    session_start: np.ndarray,
    think_s: np.ndarray,
    s_per_output_token: float = 0.02,
    run_from: float = 0.0,
) -> float:
    """Fill times in place: turn 0 at its session's start; later turns closed-loop with `think_s`.

    `session_start` is indexed by row (the start of each row's session); `think_s` by row too (only
    rows with turn > 0 are used). Nominal `arrival_s` of a later turn is the previous turn's
    arrival + `s_per_output_token` x its reply + the think time (prefill and queueing ignored).
    Rows must be grouped by session in turn order.

    Arrivals come from one running sum of those steps; a generator that fills its rows in chunks
    passes the sum the chunks before returned as `run_from`, so its times round as one whole
    draw's do (0.0: a whole draw). Returns the sum after these rows.
    """
    later = req.turn > 0
    step = np.zeros(len(req) + 1)
    step[0] = run_from
    idx = np.flatnonzero(later)
    step[idx + 1] = s_per_output_token * req.output_tokens[idx - 1] + think_s[idx]
    run = np.cumsum(step)[1:]
    first = np.maximum.accumulate(np.where(~later, np.arange(len(req)), 0))
    req.arrival_s = np.asarray(session_start, np.float64) + run - run[first]
    req.think_time_s = np.where(later, think_s, np.nan)
    return float(run[-1]) if len(req) else run_from


def drop_oversized_sessions(
    req: Requests, errors: RowErrors, where: Callable[[int], str]
) -> Requests:
    """`req` without the sessions holding a request over `MAX_REQUEST_TOKENS` prompt or reply.

    For text sources, where a request's size is the whole history before it: the culprit is the
    conversation (`where(session_id)` names its file and line), so it goes as a whole, counted
    once. Raises through `errors` unless skipping.
    """
    over = (req.input_tokens > MAX_REQUEST_TOKENS) | (req.output_tokens > MAX_REQUEST_TOKENS)
    if not over.any():
        return req
    sessions = np.unique(req.session_id[over])
    for session in sessions:
        row = int(np.flatnonzero(over & (req.session_id == session))[0])
        errors.bad(
            f"{where(int(session))}: a model call of {int(req.input_tokens[row]):,} prompt and "
            f"{int(req.output_tokens[row]):,} reply tokens is implausible (at most "
            f"{MAX_REQUEST_TOKENS:,} per request)"
        )
    return req.take(~np.isin(req.session_id, sessions))

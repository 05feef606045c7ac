"""Chat-text sources → canonical: ShareGPT JSON and LMSYS-Chat-1M Parquet, read in batches.

Structure (both formats): a conversation is a session; every assistant message is a model call
whose prompt is the whole history before it (system, user and earlier assistant messages as
segments), so turn k+1's prompt carries turn k's reply as the segment `(output_hash, tokens,
"assistant")`. Segment hashes are content hashes (same text, same kind → same hash), so a system
prompt shared by many conversations is shared KV. Token counts: see `kvsim.traces.text`.

Neither source publishes times, so session starts come from an arrival process (Poisson at `rate`
sessions/s by default) and the think time before each later turn is exponential with mean
`think_mean_s` (30 s; an assumption, no public source gives it). Both are drawn from the seed.
Hints: category 'chat'; each later turn's parent is the turn before it.

ShareGPT files (e.g. ShareGPT_V3_unfiltered_cleaned_split.json, ~650 MB) are parsed item by item
from a JSON array, and LMSYS Parquet in record batches, so neither has to fit in memory at once.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvsim.errors import TraceError
from kvsim.textio import one_line
from kvsim.traces.arrivals import ArrivalProcess, PoissonProcess
from kvsim.traces.common import (
    ChatMessages,
    Chunked,
    Requests,
    RowErrors,
    chat_requests,
    closed_loop_times,
    drop_oversized_sessions,
)
from kvsim.traces.schema import KIND_CODES
from kvsim.traces.text import TokenCounter, content_hashes

__all__ = [
    "LMSYS_COLUMNS",
    "SHAREGPT_ROLES",
    "ChatTiming",
    "iter_json_array",
    "read_lmsys",
    "read_sharegpt_json",
]

#: ShareGPT `from` values → segment kinds (variants seen in the public dumps).
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
    "assistant": "assistant", "bard": "assistant", "bing": "assistant", "system": "system",
}  # fmt: skip
LMSYS_ROLES = {"user": "user", "assistant": "assistant", "system": "system"}
LMSYS_COLUMNS = ("conversation_id", "conversation")


@dataclass
class ChatTiming:
    """Where session starts and think times come from (both seeded)."""

    process: ArrivalProcess
    think_mean_s: float
    rng: np.random.Generator
    run_s: float = 0.0  # closed_loop_times' running sum, carried across batches

    @classmethod
    def default(cls, seed: int, rate: float = 1.0, think_mean_s: float = 30.0) -> ChatTiming:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7468696E6B]))
        return cls(PoissonProcess(rate, seed), think_mean_s, rng)


def _timed_chunk(
    msgs: ChatMessages,
    session_base: int,
    timing: ChatTiming,
    errors: RowErrors,
    where: Callable[[int], str],
) -> tuple[Requests, float]:
    """Requests of one batch of conversations, timed; `where(session)` names a conversation."""
    n_conv = msgs.offsets.size - 1
    req = chat_requests(msgs, np.arange(session_base, session_base + n_conv), category="chat")
    req = drop_oversized_sessions(req, errors, where)
    starts = timing.process.draw(n_conv)
    think = timing.rng.exponential(timing.think_mean_s, len(req))
    timing.run_s = closed_loop_times(
        req, starts[req.session_id - session_base], think, run_from=timing.run_s
    )
    return req, float(starts[-1]) if n_conv else 0.0


def _kind_codes(roles: pa.Array, mapping: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Kind code per message and a mask of unknown roles."""
    keys = pa.array(list(mapping))
    codes = np.array([KIND_CODES[mapping[k]] for k in mapping], np.uint8)
    idx = pc.index_in(roles, value_set=keys).to_numpy(zero_copy_only=False)
    unknown = np.isnan(idx) if idx.dtype.kind == "f" else np.zeros(idx.size, bool)
    safe = np.where(unknown, 0, idx).astype(np.int64)
    return codes[safe], unknown


# --- ShareGPT JSON --------------------------------------------------------------------------------


def iter_json_array(
    path: Path, shown: str, chunk_bytes: int = 1 << 20
) -> Iterator[tuple[int, object]]:
    """Yield (line, item) for each item of a top-level JSON array, reading a chunk at a time."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{shown}: cannot open: {exc.strerror or exc}") from None
    with handle:
        buf, pos, line, eof, started = "", 0, 1, False, False

        def more() -> bool:
            nonlocal buf, pos, eof
            try:
                raw = handle.read(chunk_bytes)
            except OSError as exc:
                raise TraceError(f"{shown}: cannot read: {exc.strerror or exc}") from None
            try:
                data = utf8.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                at = line + buf.count("\n", pos) + exc.object.count(b"\n", 0, exc.start)
                raise TraceError(
                    f"{shown}:{at}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); "
                    "save the file as UTF-8"
                ) from None
            buf, pos = buf[pos:] + data, 0
            eof = not raw
            return bool(raw)

        while True:
            while True:  # skip whitespace and separators
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    line += buf[pos] == "\n"
                    pos += 1
                if pos < len(buf) or not more():
                    break
            if pos >= len(buf):
                raise TraceError(f"{shown}:{line}: unexpected end of file inside the JSON array")
            ch = buf[pos]
            if not started:
                if ch != "[":
                    raise TraceError(f"{shown}:{line}: expected a JSON array of conversations")
                started, pos = True, pos + 1
                continue
            if ch == "]":
                return
            while True:
                try:
                    item, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as exc:
                    if eof or not more():
                        raise TraceError(f"{shown}:{line + exc.lineno - 1}: not valid JSON: "
                                         f"{exc.msg}") from None  # fmt: skip
                except (ValueError, RecursionError) as exc:  # a 5000-digit number, [[[[...
                    what = "nested too deeply to parse" if isinstance(exc, RecursionError) else exc
                    raise TraceError(f"{shown}:{line}: not valid JSON: {what}") from None
            yield line, item
            line += buf.count("\n", pos, end)
            pos = end


def read_sharegpt_json(
    path: str | Path,
    *,
    name: str | None = None,
    shown: str | None = None,
    counter: TokenCounter | None = None,
    timing: ChatTiming | None = None,
    batch: int = 20_000,
    skip_bad_rows: bool = False,
) -> Chunked:
    """Stream a ShareGPT-format JSON file (`[{"id", "conversations": [{"from", "value"}]}]`)."""
    path = Path(path)
    shown = shown or str(path)
    counter = counter or TokenCounter()
    timing = timing or ChatTiming.default(0)
    errors = RowErrors(skip=skip_bad_rows)

    seen = [0, 0]  # conversations read, and those with a reply after the first message

    def chunks() -> Iterator[tuple[Requests, float]]:
        roles: list[str] = []
        texts: list[str] = []
        offsets = [0]
        lines: list[int] = []
        base = 0
        for line, item in iter_json_array(path, shown):
            where = f"{shown}:{line}"
            conv = item.get("conversations") if isinstance(item, dict) else None
            if not isinstance(conv, list):
                errors.bad(f"{where}: field 'conversations': missing or not a list")
                continue
            ok = True
            for msg in conv:
                role = msg.get("from") if isinstance(msg, dict) else None
                value = msg.get("value") if isinstance(msg, dict) else None
                if not isinstance(role, str) or role not in SHAREGPT_ROLES:
                    errors.bad(f"{where}: field 'from': unknown role {role!r:.60}; valid: "
                               + ", ".join(sorted(SHAREGPT_ROLES)))  # fmt: skip
                    ok = False
                    break
                if not isinstance(value, str):
                    errors.bad(f"{where}: field 'value': expected a string, got {value!r:.40}")
                    ok = False
                    break
            if not ok:
                continue
            for msg in conv:
                roles.append(msg["from"])
                texts.append(msg["value"])
            offsets.append(len(roles))
            lines.append(line)
            seen[0] += 1
            seen[1] += any(SHAREGPT_ROLES[m["from"]] == "assistant" for m in conv[1:])
            if len(offsets) > batch:
                yield _chunk_from_lists(roles, texts, offsets, base, counter, timing, errors,
                                        _locator(shown, lines, base))  # fmt: skip
                base += len(offsets) - 1
                roles, texts, offsets, lines = [], [], [0], []
        if len(offsets) > 1:
            yield _chunk_from_lists(roles, texts, offsets, base, counter, timing, errors,
                                    _locator(shown, lines, base))  # fmt: skip

    def explain() -> str:
        return _why_empty(shown, "conversations", seen[0], seen[1], errors)

    description = (
        f"ShareGPT-format conversations from {path.name}: real turn structure and text lengths "
        f"(tokens: {counter.name}); session starts and think times "
        f"(mean {timing.think_mean_s:g} s) drawn"
    )
    return Chunked(chunks(), name or path.stem, None, description, errors, explain)


def _locator(shown: str, lines: list[int], base: int) -> Callable[[int], str]:
    """Names conversation `session` of a batch by its file line (for row errors)."""
    return lambda session: f"{shown}:{lines[session - base]}"


def _why_empty(shown: str, what: str, read: int, replied: int, errors: RowErrors) -> str:
    """Why a chat source gave no requests: kvsim replays replies, and there were none."""
    skipped = f" ({errors.count:,} malformed skipped)" if errors.count else ""
    if read == 0:
        return f"{shown} holds no usable {what}{skipped}"
    if replied == 0:
        return (
            f"none of the {read:,} {what} in {shown} has an assistant reply after its first "
            f"message (first-turn prompts only?){skipped}; kvsim makes one request per reply, "
            "prompted by the history before it; the built-in trace 'sharegpt' draws replies and "
            "later turns for such prompts"
        )
    return f"every assistant reply in {shown} follows only empty messages{skipped}"


def _chunk_from_lists(
    roles, texts, offsets, base, counter, timing, errors, where
) -> tuple[Requests, float]:
    role_arr = pa.array(roles, pa.string())
    kinds, _ = _kind_codes(role_arr, SHAREGPT_ROLES)
    text_arr = pa.array(texts, pa.string())
    msgs = ChatMessages(
        np.asarray(offsets, np.int64), kinds, counter.count(text_arr),
        content_hashes(text_arr, kinds),
    )  # fmt: skip
    return _timed_chunk(msgs, base, timing, errors, where)


# --- LMSYS-Chat-1M Parquet ------------------------------------------------------------------------


def _is_text(struct: pa.StructType, name: str) -> bool:
    """The struct has exactly one field `name`, and it holds strings."""
    index = struct.get_field_index(name)  # -1 when missing or repeated
    return index >= 0 and (
        pa.types.is_string(struct.field(index).type)
        or pa.types.is_large_string(struct.field(index).type)
    )


def _checked_batches(
    pfile: pq.ParquetFile, shown: str, batch: int, columns: list[str]
) -> Iterator[pa.RecordBatch]:
    """Record batches, fully validated (UTF-8 included): a damaged file is one TraceError line
    naming the rows it was reading, not a pyarrow error from deep inside the reader."""
    batches = pfile.iter_batches(batch_size=batch, columns=columns)
    row = 0
    while True:
        try:
            rb = next(batches)
            rb.validate(full=True)
        except StopIteration:
            return
        except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: bad UTF-8
            raise TraceError(
                f"{shown}: rows from {row}: cannot read as Parquet: {one_line(exc)}"
            ) from None
        yield rb
        row += rb.num_rows


def read_lmsys(
    path: str | Path,
    *,
    name: str | None = None,
    shown: str | None = None,
    counter: TokenCounter | None = None,
    timing: ChatTiming | None = None,
    batch: int = 50_000,
    skip_bad_rows: bool = False,
) -> Chunked:
    """Stream an LMSYS-Chat-1M Parquet file (`conversation`: list of {content, role}) in batches."""
    path = Path(path)
    shown = shown or str(path)
    counter = counter or TokenCounter()
    timing = timing or ChatTiming.default(0)
    errors = RowErrors(skip=skip_bad_rows)
    try:
        pfile = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering keeps what it read
    except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: bad UTF-8
        raise TraceError(f"{shown}: cannot read as Parquet: {one_line(exc)}") from None
    names = pfile.schema_arrow.names
    for column in LMSYS_COLUMNS:
        if column not in names:
            raise TraceError(f"{shown}: field {column!r}: missing column")
        if names.count(column) > 1:
            raise TraceError(f"{shown}: field {column!r}: appears {names.count(column)} times")
    ctype = pfile.schema_arrow.field("conversation").type
    is_list = pa.types.is_list(ctype) or pa.types.is_large_list(ctype)
    item = ctype.value_type if is_list else None
    if not (
        item is not None
        and pa.types.is_struct(item)
        and all(_is_text(item, name) for name in ("content", "role"))
    ):
        raise TraceError(
            f"{shown}: field 'conversation': expected list<struct<content, role>>, got {ctype}"
        )

    seen = [0, 0]  # conversations read, and those with a reply after the first message

    def chunks() -> Iterator[tuple[Requests, float]]:
        row0 = 0
        base = 0
        for rb in _checked_batches(pfile, shown, batch, ["conversation"]):
            lists = rb.column(0)
            n = len(lists)
            null_rows = lists.is_null().to_numpy(zero_copy_only=False)
            flat = lists.flatten()
            offsets = (lists.offsets.to_numpy() - lists.offsets[0].as_py()).astype(np.int64)
            role = flat.field("role")
            content = flat.field("content")
            kinds, unknown = _kind_codes(role, LMSYS_ROLES)
            unknown |= role.is_null().to_numpy(zero_copy_only=False)
            no_text = content.is_null().to_numpy(zero_copy_only=False)
            msg_row = np.repeat(np.arange(n), np.diff(offsets))
            bad_row = null_rows.copy()
            bad_row[msg_row[unknown | no_text]] = True
            if bad_row.any():
                first = int(np.flatnonzero(bad_row)[0])
                msgs_bad = np.flatnonzero((unknown | no_text) & (msg_row == first))
                if null_rows[first]:
                    what = "field 'conversation': missing"
                elif unknown[msgs_bad[0]]:
                    what = (f"field 'conversation.role': unknown role {role[msgs_bad[0]].as_py()!r}"
                            f"; valid: {', '.join(LMSYS_ROLES)}")  # fmt: skip
                else:
                    what = "field 'conversation.content': missing"
                errors.bad(f"{shown}: row {row0 + first}: {what}")
                errors.count += int(bad_row.sum()) - 1
                keep_msg = ~bad_row[msg_row]
                counts = np.diff(offsets)
                counts[bad_row] = 0
                offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
                kinds = kinds[keep_msg]
                content = content.filter(pa.array(keep_msg))
            counts = np.diff(offsets)
            conv_of_msg = np.repeat(np.arange(n), counts)
            later = np.arange(conv_of_msg.size) > offsets[:-1][conv_of_msg]
            seen[0] += int((counts > 0).sum())
            seen[1] += np.unique(conv_of_msg[later & (kinds == KIND_CODES["assistant"])]).size
            msgs = ChatMessages(offsets, kinds, counter.count(content),
                                content_hashes(content, kinds))  # fmt: skip
            yield _timed_chunk(msgs, base, timing, errors,
                               lambda session: f"{shown}: row {session}")  # fmt: skip
            base += n
            row0 += n

    def explain() -> str:
        return _why_empty(shown, "conversations", seen[0], seen[1], errors)

    description = (
        f"LMSYS-Chat-1M-format conversations from {path.name}: real turn structure and text "
        f"lengths (tokens: {counter.name}); session starts and think times "
        f"(mean {timing.think_mean_s:g} s) drawn"
    )
    return Chunked(chunks(), name or path.stem, None, description, errors, explain)

"""`lmsys`: LMSYS-Chat-1M-shaped chat sessions drawn from its published statistics.

The raw data is gated behind a licence and cannot ship, so the built-in is a generator. Targets
(Llama-2 tokenizer; traces/PROVENANCE.md): Zheng et al. (ICLR 2024) Table 1, 2.0 turns per
conversation, 69.5 tokens per prompt, 214.5 per response; WildChat paper Table 1, LMSYS-Chat-1M
row, per-turn mean ± std: 2.02 turns, user 69.83 ± 143.49, assistant 215.71 ± 1858.09.

Drawn:
- Turns per conversation: geometric on {1, 2, ...} with mean 2.02, capped at 64.
- User messages: lognormal matched to 69.83 ± 143.49 tokens, clipped to [1, 16,384].
- Replies: lognormal matched to 215.71 ± 1858.09, clipped to [1, 8,192]. The std/mean ratio of 8.6
  is a very heavy tail: the moment-matched median is about 25 tokens, and the clip (replies
  beyond the largest context the logged models served) lowers the mean to about 170 and the std
  far more. No per-turn median is published, so the shape of the body is an assumption.
- Session starts: Poisson at `rate` sessions/s; think time before a later turn exponential, mean
  30 s (assumed; no public source). Every message has fresh content (its own hash).
- Hints: category 'chat'; each later turn follows the turn before it; no tool calls.

`stream_lmsys` yields the same trace in chunks of conversations (every random stream runs on
across chunks), so `kvsim trace synth lmsys` writes millions of requests without building the
table. `write_lmsys_parquet` writes the same draws as an LMSYS-Chat-1M-format Parquet file (text of
4 bytes per token), for fixtures and the conversion benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.traces.arrivals import ArrivalProcess, PoissonProcess
from kvsim.traces.common import ChatMessages, Chunked, Requests, chat_requests, closed_loop_times
from kvsim.traces.schema import KIND_CODES, Trace

__all__ = ["LMSYS_PARQUET_SCHEMA", "LmsysParams", "draw_lmsys", "generate_lmsys",
           "lmsys_sessions", "stream_lmsys", "write_lmsys_parquet"]  # fmt: skip


LMSYS_PARQUET_SCHEMA = pa.schema(
    [
        pa.field("conversation_id", pa.string()),
        pa.field("model", pa.string()),
        pa.field(
            "conversation",
            pa.list_(pa.struct([pa.field("content", pa.string()), pa.field("role", pa.string())])),
        ),
        pa.field("turn", pa.int64()),
        pa.field("language", pa.string()),
        pa.field("redacted", pa.bool_()),
    ]
)


def _lognormal(mean: float, std: float) -> tuple[float, float]:
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


@dataclass(frozen=True)
class LmsysParams:
    """Generator knobs; defaults are the published LMSYS-Chat-1M figures or stated assumptions."""

    # Default scenario: ~4,000 requests whose KV outgrows llama-3.1-8b's HBM on an h100-sxm
    # after about 3 simulated minutes, so eviction policies matter (issue 13).
    sessions: int = field(default=1980, metadata={"help": "conversations (~4000 requests)"})
    rate: float = field(default=6.0, metadata={"help": "session arrival rate, sessions/s"})
    mean_turns: float = field(default=2.02, metadata={"help": "WildChat Table 1, LMSYS row"})
    max_turns: int = field(default=64, metadata={"help": "cap on turns per conversation"})
    user_mean_tokens: float = field(default=69.83, metadata={"help": "WildChat Table 1"})
    user_std_tokens: float = field(default=143.49, metadata={"help": "WildChat Table 1"})
    user_max_tokens: int = field(default=16384, metadata={"help": "clip of a user message"})
    reply_mean_tokens: float = field(default=215.71, metadata={"help": "WildChat Table 1"})
    reply_std_tokens: float = field(default=1858.09, metadata={"help": "WildChat Table 1"})
    reply_max_tokens: int = field(default=8192, metadata={"help": "clip of a reply"})
    think_mean_s: float = field(default=30.0, metadata={"help": "assumed; no public source"})


class _Streams:
    """The four random streams of a draw (turns, user lengths, reply lengths, hashes).

    Each stream is drawn in order, one value per conversation or message, so conversations drawn
    in pieces one after another get the same values as drawn at once (numpy draws these
    distributions value by value, nothing carried between calls).
    """

    def __init__(self, params: LmsysParams, seed: int, first_session: int = 0) -> None:
        self.params = params
        ss = np.random.SeedSequence([seed, first_session])
        self._turns, self._user, self._reply, self._hash = (
            np.random.default_rng(s) for s in ss.spawn(4)
        )

    def turns(self, n: int) -> np.ndarray:
        """Turns of the next `n` conversations."""
        p = self.params
        return np.minimum(self._turns.geometric(1.0 / p.mean_turns, n), p.max_turns)

    def messages(self, turns: np.ndarray) -> ChatMessages:
        """Messages `u0 a0 u1 a1 ...` of the next conversations, which have these `turns`."""
        p = self.params
        offsets = np.concatenate(([0], np.cumsum(2 * turns))).astype(np.int64)
        m = int(offsets[-1])
        is_reply = (np.arange(m) - np.repeat(offsets[:-1], 2 * turns)) % 2 == 1
        tokens = np.empty(m, np.int64)
        mu, sigma = _lognormal(p.user_mean_tokens, p.user_std_tokens)
        n_user = int((~is_reply).sum())
        tokens[~is_reply] = np.clip(np.rint(self._user.lognormal(mu, sigma, n_user)), 1,
                                    p.user_max_tokens)  # fmt: skip
        mu, sigma = _lognormal(p.reply_mean_tokens, p.reply_std_tokens)
        tokens[is_reply] = np.clip(np.rint(self._reply.lognormal(mu, sigma, m - n_user)), 1,
                                   p.reply_max_tokens)  # fmt: skip
        kinds = np.where(is_reply, KIND_CODES["assistant"], KIND_CODES["user"]).astype(np.uint8)
        hashes = self._hash.integers(1, np.iinfo(np.uint64).max, m, dtype=np.uint64,
                                     endpoint=True)  # fmt: skip
        return ChatMessages(offsets, kinds, tokens, hashes)


def draw_lmsys(params: LmsysParams, seed: int, first_session: int = 0) -> ChatMessages:
    """Messages `u0 a0 u1 a1 ...` for `params.sessions` conversations (tokens and hashes)."""
    streams = _Streams(params, seed, first_session)
    return streams.messages(streams.turns(params.sessions))


def _timed_chunks(
    params: LmsysParams, seed: int, process: ArrivalProcess | None, chunk_sessions: int
) -> Iterator[tuple[Requests, float]]:
    """Requests of `params.sessions` conversations, `chunk_sessions` at a time, with each chunk's
    last session start (no later chunk has a row before it).

    Every random stream and the arrival process run on across chunks, so the chunks together are
    the same rows as one chunk of every session, bit for bit.
    """
    streams = _Streams(params, seed)
    process = process or PoissonProcess(params.rate, seed)
    think_rng = np.random.default_rng([seed, 0x7468])
    run = 0.0
    for first in range(0, params.sessions, chunk_sessions):
        n = min(chunk_sessions, params.sessions - first)
        req = chat_requests(streams.messages(streams.turns(n)), np.arange(first, first + n),
                            category="chat")  # fmt: skip
        starts = process.draw(n)
        think = think_rng.exponential(params.think_mean_s, len(req))
        run = closed_loop_times(req, starts[req.session_id - first], think, run_from=run)
        yield req, float(starts[-1])


def _description(params: LmsysParams, seed: int) -> str:
    return (
        "LMSYS-Chat-1M-like chat: turns, prompt and reply lengths drawn from published moments "
        "(WildChat Table 1, LMSYS row); Poisson session starts and think times "
        f"(assumed mean {params.think_mean_s:g} s) drawn with seed {seed}"
    )


def generate_lmsys(
    params: LmsysParams = LmsysParams(),  # frozen, so a shared default is safe
    *,
    seed: int = 0,
    process: ArrivalProcess | None = None,
    max_requests: int | None = None,
    name: str = "lmsys",
) -> Trace:
    """The `lmsys` trace; same seed and params, same table."""
    chunks = _timed_chunks(params, seed, process, max(params.sessions, 1))  # one chunk: all
    req = Requests.concat([chunk for chunk, _ in chunks])
    table = req.to_table(name=name, native_block_size=None, description=_description(params, seed))
    if max_requests is not None:
        table = table.slice(0, max_requests)
    return Trace.from_table(table)


def lmsys_sessions(params: LmsysParams, seed: int, requests: int, chunk: int = 1 << 20) -> int:
    """`params.sessions`, doubled until those sessions hold `requests` requests: the count that
    `kvsim.traces.registry` generates for `max_requests=requests`.

    A conversation makes one request per turn, so the turns stream alone decides, drawn in pieces
    of `chunk` (its first values do not depend on how many are drawn).
    """
    if params.sessions < 1 or requests < 1:
        raise ValueError(f"sessions and requests must be >= 1, got {params.sessions}, {requests}")
    streams = _Streams(params, seed)
    sessions, drawn, held = params.sessions, 0, 0
    while True:
        for first in range(drawn, sessions, chunk):
            held += int(streams.turns(min(chunk, sessions - first)).sum())
        if held >= requests:
            return sessions
        drawn, sessions = sessions, 2 * sessions


def stream_lmsys(
    params: LmsysParams,
    *,
    seed: int = 0,
    process: ArrivalProcess | None = None,
    chunk_sessions: int = 50_000,
    name: str = "lmsys",
) -> Chunked:
    """`generate_lmsys(params, ...)` as a stream of chunks of `chunk_sessions` conversations.

    `kvsim.traces.convert.convert_to_parquet(source, out, max_requests=N)` then writes what
    `generate_lmsys(params, max_requests=N)` returns, holding about one chunk in memory rather
    than the whole trace (a day at 114.6 sessions/s is 20 M requests).
    """
    if chunk_sessions < 1:
        raise ValueError(f"chunk_sessions must be >= 1, got {chunk_sessions}")
    chunks = _timed_chunks(params, seed, process, chunk_sessions)
    return Chunked(chunks, name, None, _description(params, seed))


def write_lmsys_parquet(
    path: str | Path, conversations: int, *, seed: int = 0, batch: int = 50_000,
    params: LmsysParams = LmsysParams(),
) -> None:  # fmt: skip
    """Write `conversations` drawn conversations in LMSYS-Chat-1M's Parquet layout, in batches.

    Each message's text is a unique tag padded to 4 bytes per drawn token, so the default token
    approximation reads back the drawn lengths (within the tag's rounding).
    """
    filler = "abcd" * (max(params.user_max_tokens, params.reply_max_tokens) + 8)
    with pq.ParquetWriter(Path(path), LMSYS_PARQUET_SCHEMA, compression="zstd") as writer:
        for first in range(0, conversations, batch):
            n = min(batch, conversations - first)
            msgs = draw_lmsys(LmsysParams(**{**params.__dict__, "sessions": n}), seed, first)
            counts = np.diff(msgs.offsets)
            conv = np.repeat(np.arange(first, first + n), counts)
            role = np.where(msgs.kinds == KIND_CODES["assistant"], "assistant", "user")
            texts = [
                (tag := f"{c}.{i} ") + filler[len(tag) : 4 * t]
                for i, (c, t) in enumerate(zip(conv.tolist(), msgs.tokens.tolist(), strict=True))
            ]
            values = pa.StructArray.from_arrays(
                [pa.array(texts, pa.string()), pa.array(role, pa.string())], ["content", "role"]
            )
            lists = pa.ListArray.from_arrays(pa.array(msgs.offsets, pa.int32()), values)
            ids = [f"{c:032x}" for c in range(first, first + n)]
            table = pa.Table.from_arrays(
                [pa.array(ids), pa.array(["vicuna-13b"] * n), lists, pa.array(counts // 2),
                 pa.array(["English"] * n), pa.array(np.zeros(n, bool))],
                schema=LMSYS_PARQUET_SCHEMA,
            )  # fmt: skip
            writer.write_table(table)

"""`sharegpt`: multi-turn chat sessions, partly real and partly drawn from published statistics.

No public multi-turn ShareGPT subset small enough to ship exists, so sessions are synthesised.

Real:
- First-turn user prompt lengths: drawn (with replacement) from the 500 real ShareGPT first prompts
  in traces/sharegpt/. Tokens are approximated as ceil(characters / 4), at least 1: no tokenizer is
  a dependency, and 4 characters per token is the usual rule of thumb for English text with
  BPE tokenizers. Only the length is used; every session gets fresh content (its own hash), so two
  sessions that drew the same sample prompt do not share KV.

Drawn (per-turn figures from the WildChat paper, Table 1, ShareGPT row; see traces/PROVENANCE.md):
- Turns per session: geometric on {1, 2, ...} with mean 3.51, capped at `max_turns` (32; the cap
  removes about 1e-5 of the mass).
- Later user messages: lognormal matched to mean 94.46 and std 626.39 tokens, rounded, clipped to
  [1, `user_max_tokens`]. Its median is about 14 tokens; the real median is not published and is
  probably higher (the real first turns have median 30), so short messages are over-represented
  and the tail carries the mean. The clip at 32,768 tokens keeps the mean (about 93) but cuts the
  standard deviation to roughly 450-520 in samples of 50k messages.
- Assistant replies: lognormal matched to mean 348.45 and std 269.93 tokens (median about 275),
  rounded, clipped to [1, `reply_max_tokens`].
- Session starts: Poisson process at `rate` sessions/s.
- Think time between a reply and the next user turn: exponential with mean `think_mean_s` (30 s).
  This is an assumption: no public source gives it.
- Optional system prompt of `system_prompt_tokens` shared by all sessions (none by default).

Structure: turn k's prompt is the whole history, `[system] u0 a0 u1 a1 ... uk`, where `a_i` is
the segment `(output_hash_i, output_tokens_i, "assistant")` of turn i's reply, so the next turn
reuses the KV of generated tokens. Turns after the first carry `think_time_s` (closed loop);
their `arrival_s` is a nominal open-loop estimate: previous arrival +
`nominal_s_per_output_token` x previous reply + think time (prefill and queueing ignored).

Hints: category 'chat'; each later turn's `parent_id` is the turn before it; no tool calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.traces.common import read_json
from kvsim.traces.schema import KIND_CODES, Trace, make_trace_table

__all__ = ["ShareGPTParams", "generate_sharegpt", "load_sharegpt", "read_first_turn_tokens"]

CHARS_PER_TOKEN = 4
#: Hash of the shared system prompt (fixed, so every session and every seed share it).
SYSTEM_PROMPT_HASH = 0x73797374656D0001


def _lognormal(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and standard deviation."""
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


@dataclass(frozen=True)
class ShareGPTParams:
    """Knobs of the generator; defaults are the published ShareGPT figures or stated assumptions."""

    # Default scenario: ~3,000 requests whose KV outgrows llama-3.1-8b's HBM on an h100-sxm
    # after about 2 simulated minutes, so eviction policies matter (issue 13).
    sessions: int = field(default=855, metadata={"help": "sessions; ~3000 requests at 3.51 turns"})
    rate: float = field(default=4.0, metadata={"help": "session arrival rate, sessions/s"})
    mean_turns: float = field(default=3.51, metadata={"help": "WildChat Table 1, ShareGPT"})
    max_turns: int = field(default=32, metadata={"help": "cap on turns per session"})
    user_mean_tokens: float = field(default=94.46, metadata={"help": "WildChat Table 1"})
    user_std_tokens: float = field(default=626.39, metadata={"help": "WildChat Table 1"})
    user_max_tokens: int = field(default=32768, metadata={"help": "clip of a later user turn"})
    reply_mean_tokens: float = field(default=348.45, metadata={"help": "WildChat Table 1"})
    reply_std_tokens: float = field(default=269.93, metadata={"help": "WildChat Table 1"})
    reply_max_tokens: int = field(default=4096, metadata={"help": "clip of a reply"})
    think_mean_s: float = field(default=30.0, metadata={"help": "assumed; no public source"})
    nominal_s_per_output_token: float = field(
        default=0.02, metadata={"help": "decode time per token, only for nominal arrival_s"}
    )
    system_prompt_tokens: int = field(default=0, metadata={"help": "shared system prompt"})


def read_first_turn_tokens(path: str | Path, shown: str | None = None) -> np.ndarray:
    """Token counts (ceil(chars / 4), >= 1) of the first human message of each conversation."""
    path = Path(path)
    shown = shown or str(path)
    data = read_json(path, shown)
    if not isinstance(data, list) or not data:
        raise TraceError(f"{shown}: expected a non-empty JSON list of conversations")
    tokens = []
    for i, conv in enumerate(data):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        text = next(
            (
                t.get("value")
                for t in (turns if isinstance(turns, list) else [])
                if isinstance(t, dict) and t.get("from") == "human"
            ),
            None,
        )
        if not isinstance(text, str):
            raise TraceError(
                f"{shown}: item {i}: field 'conversations': expected a human message with a "
                "string 'value'"
            )
        tokens.append(max(1, -(-len(text) // CHARS_PER_TOKEN)))
    return np.asarray(tokens, dtype=np.int64)


def _draw_lognormal(
    rng: np.random.Generator, mean: float, std: float, n: int, hi: int
) -> np.ndarray:
    mu, sigma = _lognormal(mean, std)
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, hi).astype(np.int64)


def generate_sharegpt(
    first_turn_tokens: np.ndarray,
    params: ShareGPTParams = ShareGPTParams(),  # frozen, so a shared default is safe
    *,
    seed: int = 0,
    max_requests: int | None = None,
    name: str = "sharegpt",
) -> Trace:
    """Synthesise chat sessions (see module docstring); same seed and params, same table.

    Each random quantity has its own stream, so adding sessions extends, not reshuffles, the draws.
    `max_requests` keeps the first N requests by arrival; whole earlier turns always come first.
    """
    first_pool = np.asarray(first_turn_tokens, dtype=np.int64)
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(8)]
    r_start, r_turns, r_first, r_user, r_reply, r_think, r_uhash, r_ohash = streams
    n_sess = params.sessions

    gaps = r_start.exponential(1.0 / params.rate, n_sess)
    start_s = np.cumsum(gaps) - gaps[0]
    turns = np.minimum(r_turns.geometric(1.0 / params.mean_turns, n_sess), params.max_turns)
    n_req = int(turns.sum())
    sess_first = np.concatenate(([0], np.cumsum(turns)[:-1])).astype(np.int64)
    session = np.repeat(np.arange(n_sess, dtype=np.int64), turns)
    turn = np.arange(n_req, dtype=np.int64) - sess_first[session]
    later = turn > 0

    user = np.empty(n_req, dtype=np.int64)
    user[~later] = first_pool[r_first.integers(0, first_pool.size, n_sess)]
    user[later] = _draw_lognormal(
        r_user,
        params.user_mean_tokens,
        params.user_std_tokens,
        int(later.sum()),
        params.user_max_tokens,
    )
    reply = _draw_lognormal(
        r_reply, params.reply_mean_tokens, params.reply_std_tokens, n_req, params.reply_max_tokens
    )
    think = np.full(n_req, np.nan)
    think[later] = r_think.exponential(params.think_mean_s, int(later.sum()))
    hash_hi = np.iinfo(np.uint64).max
    user_hash = r_uhash.integers(1, hash_hi, n_req, dtype=np.uint64, endpoint=True)
    out_hash = r_ohash.integers(1, hash_hi, n_req, dtype=np.uint64, endpoint=True)

    # Nominal arrivals: a running sum of (previous reply's decode + think time) within a session.
    step = np.zeros(n_req)
    step[later] = (
        params.nominal_s_per_output_token * reply[np.flatnonzero(later) - 1] + think[later]
    )
    run = np.cumsum(step)
    arrival_s = start_s[session] + run - run[sess_first[session]]

    # Segments: [system] u0 a0 u1 a1 ... uk for request k of a session, built flat.
    n_sys = 1 if params.system_prompt_tokens > 0 else 0
    counts = n_sys + 2 * turn + 1
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    owner = np.repeat(np.arange(n_req, dtype=np.int64), counts)
    pos = np.arange(offsets[-1], dtype=np.int64) - offsets[owner] - n_sys
    src = sess_first[session[owner]] + np.maximum(pos, 0) // 2
    is_user = pos % 2 == 0
    seg_hashes = np.where(is_user, user_hash[src], out_hash[src])
    seg_tokens = np.where(is_user, user[src], reply[src])
    seg_kinds = np.where(is_user, KIND_CODES["user"], KIND_CODES["assistant"]).astype(np.uint8)
    if n_sys:
        is_sys = pos < 0
        seg_hashes[is_sys] = np.uint64(SYSTEM_PROMPT_HASH)
        seg_tokens[is_sys] = params.system_prompt_tokens
        seg_kinds[is_sys] = KIND_CODES["system"]
    input_tokens = np.add.reduceat(seg_tokens, offsets[:-1])

    # Request ids follow (arrival, session, turn), so the canonical sort keeps turns in order.
    order = np.lexsort((turn, session, arrival_s))
    request_id = np.empty(n_req, dtype=np.int64)
    request_id[order] = np.arange(n_req)
    # Each later turn follows the turn before it (the row before it: rows are session-major).
    parent_id = np.where(later, request_id[np.maximum(np.arange(n_req) - 1, 0)], -1)

    description = (
        "ShareGPT-like chat: real first-turn prompt lengths (500 ShareGPT prompts, chars/4); "
        "turns, later prompts, replies (WildChat Table 1 moments), Poisson session arrivals and "
        f"think times (assumed mean {params.think_mean_s:g} s) drawn with seed {seed}"
    )
    table = make_trace_table(
        request_id=request_id,
        session_id=session,
        turn=turn.astype(np.int32),
        arrival_s=arrival_s,
        think_time_s=think,
        input_tokens=input_tokens,
        output_tokens=reply,
        seg_offsets=offsets,
        seg_hashes=seg_hashes,
        seg_tokens=seg_tokens,
        seg_kinds=seg_kinds,
        output_hash=out_hash,
        name=name,
        native_block_size=None,
        description=description,
        parent_id=parent_id,
        category="chat",
    )
    if max_requests is not None:
        table = table.slice(0, max_requests)
    return Trace.from_table(table)


def load_sharegpt(
    path: str | Path,
    *,
    shown: str | None = None,
    max_requests: int | None = None,
    rate: float | None = None,
    rate_scale: float = 1.0,
    seed: int = 0,
    params: ShareGPTParams | None = None,
) -> Trace:
    """Generate the `sharegpt` trace from the real first-turn sample at `path`.

    Session rate is `rate` (default `params.rate`) times `rate_scale`. With `max_requests` larger
    than the default run, enough extra sessions are generated to reach it.
    """
    params = params or ShareGPTParams()
    params = replace(params, rate=(params.rate if rate is None else rate) * rate_scale)
    pool = read_first_turn_tokens(path, shown)
    if max_requests is None:
        return generate_sharegpt(pool, params, seed=seed)
    sessions = max(params.sessions, math.ceil(max_requests / params.mean_turns * 1.25) + 8)
    while True:
        trace = generate_sharegpt(
            pool, replace(params, sessions=sessions), seed=seed, max_requests=max_requests
        )
        if len(trace) >= max_requests:
            return trace
        sessions *= 2

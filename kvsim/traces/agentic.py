"""`agentic`: coding-agent sessions, shaped by the real Pi (Dynamo) and SWE-agent samples.

A session is a loop of model calls. The first prompt is a long system/tool prompt shared by every
session (one hash) plus the session's task; each later call re-sends the whole history with the
previous reply and the tool output appended. Between calls the agent waits for its tools (think
time). Some sessions spawn subagents: each is its own session whose first prompt is the root's
system prompt and task (the root's prefix, shared KV) plus its own instruction; the root's next
call waits for its slowest subagent.

Shaping (from traces/dynamo-pi-coding-agent and traces/swe-agent-trajectories; figures in
docs/traces.md, all assumptions stated here):
- System/tool prompt 4,000 tokens: Pi's first root call is 4,736 tokens, SWE-agent's system prompt
  plus demonstration is about 6,000 (chars/4).
- Task: lognormal, mean 500 ± 400 tokens.
- Calls per session: 1 + geometric with mean 7 (Pi sessions 2-6, SWE-agent runs 5-13), cap 60.
- Reply: lognormal 300 ± 300 tokens (Pi mean 476, SWE-agent GPT-4 runs about 110).
- Tool output appended after each reply: lognormal 350 ± 700 tokens (SWE-agent observations run
  from tens to over 1,000 tokens; Pi's tool results add 40-250).
- Tool wait: lognormal 0.5 ± 1.0 s (Pi tools 1-90 ms plus harness; SWE-agent demo 0.12-1.95 s).
- Subagents: a session spawns with probability 0.3, after its first call, 1-3 subagents (Pi: one
  root, three subagents) of 2 + geometric(mean 3) calls; instruction 300 ± 200 tokens.
- Root sessions start as a Poisson process at `rate` sessions/s.
Each reply and tool output has fresh content (its own hash).

Hints (`kvsim.traces.schema`): category 'agent'; a later call's parent is the call before it in
its session, a subagent's first call's parent is the root's first call (which spawned it); a
tool call has `tool_wait_s` = `tool_wait_mean_s`, the mean of the wait distribution, never the
drawn wait. Which replies are tool calls is drawn apart from the session's continuation with
published abandonment and interruption rates (`kvsim.traces.toolhint`, issue 45): a session's
last reply is sometimes a tool call that never returns, and a continuing reply is sometimes
unmarked. The root's spawning call also waits for its subagents; the hint does not include that
(no tool kind here has a mean for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvsim.traces.arrivals import ArrivalProcess, PoissonProcess
from kvsim.traces.common import ChatMessages, chat_requests, closed_loop_times
from kvsim.traces.schema import KIND_CODES, Trace

__all__ = ["AgenticParams", "generate_agentic"]

#: Hash of the shared system/tool prompt (fixed across sessions and seeds).
AGENT_SYSTEM_HASH = 0x6167656E74730001
S_PER_OUTPUT_TOKEN = 0.02


@dataclass(frozen=True)
class AgenticParams:
    """Generator knobs (see the module docstring for where each default comes from)."""

    sessions: int = field(default=100, metadata={"help": "root sessions (~1000 requests)"})
    # 0.2/s: the KV outgrows llama-3.1-8b's HBM on an h100-sxm after about 5 minutes (issue 13).
    rate: float = field(default=0.2, metadata={"help": "root session starts per s"})
    system_tokens: int = field(default=4000, metadata={"help": "shared system/tool prompt"})
    task_mean_tokens: float = 500.0
    task_std_tokens: float = 400.0
    mean_calls: float = field(default=8.0, metadata={"help": "1 + geometric(mean 7)"})
    max_calls: int = 60
    reply_mean_tokens: float = 300.0
    reply_std_tokens: float = 300.0
    tool_mean_tokens: float = 350.0
    tool_std_tokens: float = 700.0
    tool_wait_mean_s: float = 0.5
    tool_wait_std_s: float = 1.0
    subagent_prob: float = 0.3
    max_subagents: int = 3
    subagent_mean_calls: float = field(default=5.0, metadata={"help": "2 + geometric(mean 3)"})
    subagent_task_mean_tokens: float = 300.0
    subagent_task_std_tokens: float = 200.0


def _lognormal(rng: np.random.Generator, mean: float, std: float, n: int) -> np.ndarray:
    sigma2 = math.log1p((std / mean) ** 2)
    return rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)


def generate_agentic(
    params: AgenticParams = AgenticParams(),  # frozen, so a shared default is safe
    *,
    seed: int = 0,
    process: ArrivalProcess | None = None,
    max_requests: int | None = None,
    name: str = "agentic",
) -> Trace:
    """The `agentic` trace; same seed and params, same table."""
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence([seed, 0x61]).spawn(6)]
    r_shape, r_tok, r_hash, r_wait, r_sub, r_hint = streams
    n_root = params.sessions
    root_calls = np.minimum(1 + r_shape.geometric(1 / (params.mean_calls - 1), n_root),
                            params.max_calls)  # fmt: skip
    spawns = r_sub.random(n_root) < params.subagent_prob
    n_subs = np.where(spawns, r_sub.integers(1, params.max_subagents + 1, n_root), 0)
    sub_parent = np.repeat(np.arange(n_root), n_subs)
    sub_calls = 2 + r_shape.geometric(1 / (params.subagent_mean_calls - 2), sub_parent.size)
    task = _lognormal(r_tok, params.task_mean_tokens, params.task_std_tokens, n_root)
    task = np.maximum(1, np.rint(task)).astype(np.int64)
    task_hash = r_hash.integers(1, 2**63, n_root, dtype=np.uint64)

    # Messages per conversation: roots then subagents. Root: sys task (a tool)* a; subagent:
    # sys task_of_root instruction (a tool)* a.
    sys_kind, user, asst, tool = (KIND_CODES[k] for k in ("system", "user", "assistant", "tool"))
    calls = np.concatenate([root_calls, sub_calls])
    n_conv = calls.size
    head = np.where(np.arange(n_conv) < n_root, 2, 3)
    sizes = head + 2 * calls - 1
    total = int(sizes.sum())
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    conv = np.repeat(np.arange(n_conv), sizes)
    pos = np.arange(total) - offsets[conv]
    body = pos - head[conv]  # 0, 1, 2, ... after the head: a tool a tool ... a
    kind = np.where(body % 2 == 0, asst, tool).astype(np.uint8)
    tok = np.where(
        body % 2 == 0,
        _lognormal(r_tok, params.reply_mean_tokens, params.reply_std_tokens, total),
        _lognormal(r_tok, params.tool_mean_tokens, params.tool_std_tokens, total),
    )
    tok = np.maximum(1, np.rint(tok)).astype(np.int64)
    hsh = r_hash.integers(1, 2**64 - 1, total, dtype=np.uint64)
    root_of = np.where(conv < n_root, conv, sub_parent[np.maximum(conv - n_root, 0)])
    is_sys, is_task, is_instr = pos == 0, pos == 1, (pos == 2) & (conv >= n_root)
    kind[is_sys], tok[is_sys], hsh[is_sys] = sys_kind, params.system_tokens, AGENT_SYSTEM_HASH
    kind[is_task], tok[is_task], hsh[is_task] = (
        user,
        task[root_of[is_task]],
        task_hash[root_of[is_task]],
    )
    n_instr = int(is_instr.sum())
    kind[is_instr] = user
    instr = _lognormal(
        r_tok, params.subagent_task_mean_tokens, params.subagent_task_std_tokens, n_instr
    )
    tok[is_instr] = np.maximum(1, np.rint(instr))
    msgs = ChatMessages(offsets, kind, tok, hsh)
    # Hints: a tool call (drawn apart from the continuation: kvsim.traces.toolhint) is expected
    # back after the mean tool wait (never the drawn wait); a subagent's first call follows the
    # root call that spawned it (the root's first).
    req = chat_requests(msgs, np.arange(n_conv), category="agent",
                        tool_wait_s=params.tool_wait_mean_s, hint_rng=r_hint)  # fmt: skip
    spawned = (req.session_id >= n_root) & (req.turn == 0)
    req.parent_session[spawned] = sub_parent[req.session_id[spawned] - n_root]
    req.parent_turn[spawned] = 0

    wait = _lognormal(r_wait, params.tool_wait_mean_s, params.tool_wait_std_s, len(req))
    process = process or PoissonProcess(params.rate, seed)
    root_start = process.draw(n_root)
    # Pass 1: subagent durations (start-independent), and root times before the subagent wait.
    start = np.zeros(n_conv)
    start[:n_root] = root_start
    closed_loop_times(req, start[req.session_id], wait)
    is_sub_row = req.session_id >= n_root
    sub_dur = np.zeros(n_conv)
    last_rows = np.flatnonzero(np.r_[req.session_id[1:] != req.session_id[:-1], True])
    sub_dur[req.session_id[last_rows]] = (
        req.arrival_s[last_rows] + S_PER_OUTPUT_TOKEN * req.output_tokens[last_rows]
        - start[req.session_id[last_rows]]
    )  # fmt: skip
    # The root's second call (turn 1) waits for its slowest subagent.
    slowest = np.zeros(n_root)
    np.maximum.at(slowest, sub_parent, sub_dur[n_root:])
    second = np.flatnonzero(~is_sub_row & (req.turn == 1))
    wait[second] = np.maximum(wait[second], slowest[req.session_id[second]])
    closed_loop_times(req, start[req.session_id], wait)
    first_root_call = np.flatnonzero(~is_sub_row & (req.turn == 0))
    spawn_at = np.zeros(n_root)
    spawn_at[req.session_id[first_root_call]] = (
        req.arrival_s[first_root_call] + S_PER_OUTPUT_TOKEN * req.output_tokens[first_root_call]
    )
    start[n_root:] = spawn_at[sub_parent]
    closed_loop_times(req, start[req.session_id], wait)
    description = (
        "Agentic coding sessions shaped by the Pi (Dynamo) and SWE-agent samples: shared "
        f"{params.system_tokens}-token system prompt, growing history, tool outputs and waits, "
        f"subagents sharing the root prefix; all lengths and times drawn with seed {seed}"
    )
    table = req.to_table(name=name, native_block_size=None, description=description)
    if max_requests is not None:
        table = table.slice(0, max_requests)
    return Trace.from_table(table)

"""No policy may look at the future: its decisions up to a point depend only on the past.

Each policy (every built-in but the offline oracles) replays a trace through the engine's pool,
and then the same trace with everything after request `K` changed: later requests reordered,
retimed and relabelled (sessions, turns, categories, pending tool calls). The victims it chose
while serving the first `K` requests must be the same in both runs, and the same as in a replay
that stops at `K`. A policy that read later rows (through hints built from them, a precomputed
table, or the replay's own arrays) would choose differently.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kvsim.mrc import BlockSequence, replay
from kvsim.policies import builtin_policy_names, make_policy, resolve_policy
from kvsim.traces import Trace, load_trace

K = 150
ONLINE = [n for n in builtin_policy_names() if not resolve_policy(n).needs_future]
#: Settings that make a policy decide by what it learned well before request K: `learned`
#: trains its first model after 200 labels and refits every 3,000 (its defaults wait for 1,000).
#: ema-head's head-granular replay frees groups, not victims: whole blocks, same scores.
PARAMS = {
    "learned": {"min_samples": 200, "retrain_every": 3000, "sample_every": 2},
    "ema-head": {"head_granular": False},
}


def _changed_future(trace: Trace, k: int, seed: int) -> Trace:
    """`trace` with rows k.. replaced: their contents reversed, re-timed and re-labelled."""
    t = trace.table
    rng = np.random.default_rng(seed)
    head, tail = t.slice(0, k), t.slice(k)
    tail = tail.take(pa.array(np.arange(tail.num_rows)[::-1]))
    columns = {name: tail.column(name) for name in tail.schema.names}
    start = float(t.column("arrival_s")[k - 1].as_py())
    gaps = rng.exponential(0.5, tail.num_rows)
    columns["arrival_s"] = pa.array(start + np.cumsum(gaps))
    columns["request_id"] = pa.array(np.arange(tail.num_rows) + 10**9, pa.int64())
    columns["session_id"] = pa.array(rng.integers(0, 7, tail.num_rows), pa.int64())
    if "category" in columns:
        columns["category"] = pa.array(rng.choice(["chat", "api", "agent"], tail.num_rows))
    if "tool_wait_s" in columns:
        columns["tool_wait_s"] = pa.array(rng.uniform(0, 30, tail.num_rows))
    tail = pa.table(
        [columns[n].cast(t.schema.field(n).type) for n in t.schema.names], schema=t.schema
    )
    return Trace.from_table(pa.concat_tables([head, tail]), trace.name)


def _victims(seq: BlockSequence, name: str, capacity: int) -> list[tuple[int, ...]]:
    policy = make_policy(name, PARAMS.get(name))
    chosen: list[tuple[int, ...]] = []
    evict = policy.evict

    def recording(count: int) -> list[int]:
        out = evict(count)
        chosen.append(tuple(out))
        return out

    policy.evict = recording  # type: ignore[method-assign]
    replay(seq, policy, capacity, "prefix")
    if name == "learned":
        assert policy.retrains > 0, "the model must be trained before request K"  # type: ignore[attr-defined]
    return chosen


@pytest.fixture(scope="module")
def traces() -> dict[str, tuple[BlockSequence, BlockSequence, BlockSequence]]:
    out = {}
    for name in ("sharegpt", "agentic"):
        trace = load_trace(name, max_requests=2 * K)
        block = trace.native_block_size or 16
        changed = _changed_future(trace, K, seed=1)
        past = Trace.from_table(trace.table.slice(0, K), trace.name)
        out[name] = tuple(BlockSequence.from_trace(t, block) for t in (trace, changed, past))  # type: ignore[assignment]
    return out


@pytest.mark.parametrize("name", ONLINE)
@pytest.mark.parametrize("trace", ["sharegpt", "agentic"])
def test_decisions_ignore_the_future(name: str, trace: str, traces) -> None:
    full, changed, past = traces[trace]
    capacity = 400 if trace == "sharegpt" else 1200
    before = _victims(past, name, capacity)
    assert before, "the check needs evictions before request K"
    assert _victims(full, name, capacity)[: len(before)] == before
    assert _victims(changed, name, capacity)[: len(before)] == before

"""Closed-loop turns' arrival times as this run's model expects them, for cutting windows.

A closed-loop turn arrives when its previous turn finishes plus the think time, so its time is
known only as the run unfolds. Loaders write a nominal time (kvsim.traces.common: 20 ms per
reply token), which on a fast GPU can run tens of seconds ahead of the engine within one
session; a window would then count, and its warm-up replay, issue such turns far from where
one run has them. Before it cuts, a sharded run re-times each closed-loop turn with its own
cost model: the previous turn's arrival, plus its unloaded service time (its prompt's prefill,
then its reply at a batch-1 decode step), plus the think time. Queueing under load still makes
real turns later; that residue is what `benchmarks/bench_shards.py` measures.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from kvsim.costmodel import CostModel
from kvsim.traces import Trace
from kvsim.traces.replay import previous_turns

#: prompts and contexts are priced in buckets of this many tokens (one cost-model call each)
BUCKET = 64


def service_s(cost: CostModel, input_tokens: np.ndarray, output_tokens: np.ndarray, chunk: int):
    """Each request's unloaded service time: its whole prompt's prefill, then one batch-1
    decode step per further reply token at its mean context."""
    prompt = (np.asarray(input_tokens, np.int64) + BUCKET - 1) // BUCKET
    context = (np.asarray(input_tokens, np.int64) + np.asarray(output_tokens, np.int64) // 2) // (
        BUCKET
    )
    out = np.zeros(len(prompt))
    keys, inverse = np.unique(prompt, return_inverse=True)
    prefill = np.array([cost.prefill_time_s(int(k) * BUCKET, 0, chunk) if k else 0.0 for k in keys])
    out += prefill[inverse]
    keys, inverse = np.unique(context, return_inverse=True)
    step = np.array([cost.iteration_time_s([], [max(int(k) * BUCKET, 1)]) for k in keys])
    out += step[inverse] * np.maximum(np.asarray(output_tokens, np.int64) - 1, 0)
    return out


def follow_chains(
    new: np.ndarray,
    service: np.ndarray,
    rows: np.ndarray,
    prev: np.ndarray,
    think: np.ndarray,
    turn: np.ndarray,
) -> None:
    """In place: each of `rows` whose `prev` (the row of the turn before it, -1: none) is set
    gets the previous turn's estimate, plus its service time, plus its own think time
    (`prev`, `think` and `turn` are per row of `rows`; `new` and `service` by row).

    One row at a time in effect (turn by turn, so a previous turn is estimated first), so a
    run that re-times its trace in batches (kvsim.shard.source) gets the same bits as one
    that re-times it whole."""
    chained = prev >= 0
    if not chained.any():
        return
    rows, prev, think, turn = rows[chained], prev[chained], think[chained], turn[chained]
    for k in np.unique(turn):
        at = turn == k
        p = prev[at]
        new[rows[at]] = (new[p] + service[p]) + think[at]


def closed_loop(table: pa.Table) -> np.ndarray:
    """Rows that arrive a think time after their previous turn finishes."""
    think = table.column("think_time_s").is_valid().to_numpy(zero_copy_only=False)
    return think & (table.column("turn").to_numpy() > 0)


def retimed(trace: Trace, cost: CostModel, chunk: int) -> Trace:
    """`trace` with each closed-loop turn's ``arrival_s`` re-estimated (see the module
    docstring); a trace without closed-loop turns comes back as it is."""
    t = trace.table
    closed = closed_loop(t)
    if not closed.any():
        return trace
    turn = t.column("turn").to_numpy()
    prev = previous_turns(t.column("session_id").to_numpy(), turn, closed)
    service = service_s(
        cost, t.column("input_tokens").to_numpy(), t.column("output_tokens").to_numpy(), chunk
    )
    think = t.column("think_time_s").fill_null(0.0).to_numpy()
    new = t.column("arrival_s").to_numpy().astype(np.float64)
    follow_chains(new, service, np.arange(len(new)), prev, think, turn)
    column = t.schema.get_field_index("arrival_s")
    table = t.set_column(column, t.schema.field(column), pa.array(new))
    return dataclasses.replace(trace, table=table)

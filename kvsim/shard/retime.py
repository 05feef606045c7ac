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


def retimed(trace: Trace, cost: CostModel, chunk: int) -> Trace:
    """`trace` with each closed-loop turn's ``arrival_s`` re-estimated (see the module
    docstring); a trace without closed-loop turns comes back as it is."""
    t = trace.table
    think = t.column("think_time_s")
    turn = t.column("turn").to_numpy()
    closed = think.is_valid().to_numpy(zero_copy_only=False) & (turn > 0)
    if not closed.any():
        return trace
    session = t.column("session_id").to_numpy()
    arrival = t.column("arrival_s").to_numpy().astype(np.float64)
    order = np.lexsort((turn, session))
    s, k = session[order], turn[order]
    # a closed-loop row follows the row before it in (session, turn) order, if that is its
    # previous turn; any other row starts a chain at its own time
    follows = np.zeros(len(order), dtype=bool)
    follows[1:] = closed[order][1:] & (s[1:] == s[:-1]) & (k[1:] == k[:-1] + 1)
    inputs = t.column("input_tokens").to_numpy()[order]
    outputs = t.column("output_tokens").to_numpy()[order]
    service = service_s(cost, inputs, outputs, chunk)
    step = np.zeros(len(order))
    step[1:] = service[:-1] + think.fill_null(0.0).to_numpy()[order][1:]
    step[~follows] = 0.0
    run = np.cumsum(step)
    start = np.maximum.accumulate(np.where(~follows, np.arange(len(order)), 0))
    estimate = arrival[order][start] + run - run[start]
    new = arrival.copy()
    new[order] = estimate
    column = t.schema.get_field_index("arrival_s")
    table = t.set_column(column, t.schema.field(column), pa.array(new))
    return dataclasses.replace(trace, table=table)

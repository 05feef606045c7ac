"""Where one iteration's time goes: weights, GEMMs, elementwise passes, attention, all-reduce,
fixed costs and the engine's CPU work, for a few batch shapes.

A user who sees a 22 ms decode step for a model whose weights take 10 ms to read should find
the other 12 ms here. The parts are those `RooflineCostModel.iteration_time_s` adds, recomputed
term by term; `total_s` is the model's own answer and `parts_s` sum to it (tests check this).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.costmodel.factory import CostModel
from kvsim.costmodel.roofline import RooflineCostModel

#: The shapes `kvsim profile show --model` prices: (label, prefill chunks, decode contexts).
SHAPES: tuple[tuple[str, tuple[tuple[int, int], ...], tuple[int, ...]], ...] = (
    ("decode, batch 1, 1k context", (), (1024,)),
    ("decode, batch 32, 1k context", (), (1024,) * 32),
    ("decode, batch 128, 4k context", (), (4096,) * 128),
    ("prefill 2k tokens", ((2048, 0),), ()),
    ("mixed: 512-token chunk + 64 decodes", ((512, 0),), (1024,) * 64),
)


@dataclass(frozen=True)
class Breakdown:
    """One iteration's parts, in seconds, and what the cost model says it takes in all."""

    label: str
    tokens: int
    weights_read_s: float  # every weight byte once at the achieved HBM bandwidth (a reference)
    parts_s: dict[str, float]  # these add up to total_s
    total_s: float


def iteration_breakdown(
    cost: CostModel, label: str, prefill: list[tuple[int, int]], decode: list[int]
) -> Breakdown:
    """The parts of one iteration of ``prefill`` chunks and ``decode`` contexts."""
    roof: RooflineCostModel = cost.roofline if hasattr(cost, "roofline") else cost
    r = roof.rates
    tokens = sum(n for n, _ in prefill) + len(decode)
    sequences = len(prefill) + len(decode)
    flops = roof.linear_flops_per_token * tokens + roof.lm_head_flops_per_seq * sequences
    gemm_floors = roof.gemm_kernels * r.kernel_floor_s
    gemm = float(r.gemm_s(flops, roof.weight_bytes, roof.gemm_kernels))
    ew_floors = roof.elementwise_kernels * r.elementwise_floor_s
    ew = float(r.elementwise_s(tokens * roof.elementwise_bytes_per_token, roof.elementwise_kernels))
    allreduce = float(roof.allreduce_iteration_s(tokens))
    attention, attention_floors = _attention(roof, prefill, decode)
    gpu = gemm + ew + allreduce + attention
    total = float(cost.iteration_time_s(list(prefill), np.asarray(decode, dtype=np.int64)))
    if cost is not roof:  # measured tables: the roofline's parts, scaled to the measured whole
        scale = (total - roof.overhead_s) / gpu if gpu > 0 else 1.0
        gemm, ew, allreduce, attention = (x * scale for x in (gemm, ew, allreduce, attention))
        gpu = gemm + ew + allreduce + attention
    parts = {
        "GEMMs (weights, roofline)": gemm - gemm_floors,
        "GEMM fixed costs": gemm_floors,
        "elementwise (norms, RoPE, act.)": ew - ew_floors,
        "elementwise fixed costs": ew_floors,
        "attention (KV reads, FLOPs)": attention - attention_floors,
        "attention fixed costs": attention_floors,
        "all-reduce": allreduce,
    }
    parts["waiting on eager launches"] = 0.0
    parts["engine CPU (not overlapped)"] = total - gpu
    clock = roof.clock
    if cost is roof and tokens > clock.graph_max_tokens and gpu < clock.launch_floor_s:
        parts["waiting on eager launches"] = clock.launch_floor_s - gpu
        parts["engine CPU (not overlapped)"] = total - clock.launch_floor_s
    return Breakdown(label, tokens, roof.weight_bytes / r.bytes_per_s, parts, total)


def _attention(
    roof: RooflineCostModel, prefill: list[tuple[int, int]], decode: list[int]
) -> tuple[float, float]:
    """(attention seconds, of which fixed costs), as `iteration_time_s` prices them."""
    r, layers = roof.rates, roof.attention_layers
    pf = pb = 0.0
    for new, context in prefill:
        f, b = roof._prefill_pairs_and_reads(new, context)
        pf, pb = pf + f, pb + b
    df = db = 0.0
    if decode:
        df, db = roof._decode_step_work(list(decode))
    if not prefill and not decode:
        return 0.0, 0.0
    if not r.splits_attention:
        return float(roof._attention_s(pf + df, pb + db)), layers * r.attention_floor_s
    per_sequence = layers * len(decode) * r.decode_attention_per_sequence_s
    if not prefill:
        floor = layers * r.decode_attention_floor_s + per_sequence
        return float(r.decode_attention_s(df, db, layers, len(decode))), floor
    floor = layers * max(r.attention_floor_s, r.decode_attention_floor_s) + per_sequence
    return float(r.mixed_attention_s(pf, pb, df, db, layers, len(decode))), floor


def format_breakdowns(cost: CostModel, header: str) -> str:
    """A table: one column per shape in `SHAPES`, one row per part, times in milliseconds."""
    rows = [iteration_breakdown(cost, label, list(p), list(d)) for label, p, d in SHAPES]
    names = list(rows[0].parts_s)
    width = max(len(n) for n in [*names, "weights read once (reference)"]) + 2
    lines = [header, ""]
    for b in rows:
        lines.append(f"  [{SHAPES.index(next(s for s in SHAPES if s[0] == b.label)) + 1}] "
                     f"{b.label} ({b.tokens:,} tokens)")  # fmt: skip
    lines.append("")
    head = "".join(f"{f'[{i + 1}]':>10}" for i in range(len(rows)))
    lines.append(f"{'ms':<{width}}{head}")
    for name in names:
        cells = "".join(f"{b.parts_s[name] * 1e3:>10.3f}" for b in rows)
        lines.append(f"{name:<{width}}{cells}")
    lines.append(f"{'iteration':<{width}}" + "".join(f"{b.total_s * 1e3:>10.3f}" for b in rows))
    lines.append(
        f"{'weights read once (reference)':<{width}}"
        + "".join(f"{b.weights_read_s * 1e3:>10.3f}" for b in rows)
    )
    return "\n".join(lines)

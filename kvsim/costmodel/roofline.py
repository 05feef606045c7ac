"""Iteration time of one forward pass of a batch: a sum of per-kernel rooflines.

An iteration runs its kernels one after another, so its time is the sum of theirs, as in Vidur
(Agrawal et al., MLSys 2024) and measured with its profiling data (docs/validation.md):

    t = t_gemm + t_elementwise + t_attention + t_allreduce + t_iteration_overhead

- t_gemm: the weight matmuls (2 x active parameters FLOPs per token, every weight byte read once
  per iteration), one fixed cost per kernel plus the soft roofline of kvsim.costmodel.kernels;
- t_elementwise: norms, RoPE, activation, residual adds and the KV write, memory-bound passes
  over each token's activations, with their own bandwidth efficiency and fixed cost per kernel;
- t_attention: per layer, a fixed cost plus the soft roofline of the (query, key) pair FLOPs at
  attention's own efficiency and the KV bytes read (context within each group's window) and
  written;
- t_allreduce: two all-reduces per layer of tokens x hidden x 2 bytes at tensor parallelism,
  each priced by the profile's algorithms (latency + bytes / bus bandwidth, the cheapest);
- t_iteration_overhead: the engine's CPU time per iteration (schedule, prepare, sample), added
  to the GPU's time or, under an engine that overlaps scheduling, hidden behind it
  (kvsim.costmodel.engine_terms, with the eager launch floor outside CUDA graphs).

Under an engine profile whose kernel terms split attention (``decode_attention``), decode
attention is priced at its own share of HBM bandwidth with a cost per sequence, and prefill
attention at an efficiency that rises with the chunk's length (``attention_ramp_tokens``).

FLOPs run at the peak of the compute dtype: FP8 weights on a GPU with FP8 tensor cores run
W8A8 at the FP8 peak (vLLM's FP8 path on Hopper and later), anything else at the BF16 peak.
Measured tables from calibration replace this model when a profile carries them
(``kvsim.costmodel.make_cost_model``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.costmodel.chunked_prefill import ChunkedPrefill
from kvsim.costmodel.engine_terms import IterationClock, kernel_terms_note, under_engine
from kvsim.costmodel.kernels import (
    ELEMENTWISE_KERNELS_PER_LAYER,
    KernelRates,
    as_float,
    elementwise_bytes_per_token,
    summed,
)
from kvsim.engines import EngineProfile
from kvsim.hardware.attention_pairs import windowed_pairs
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import (
    LayerGroup,
    ModelSpec,
    attention_costs,
    linear_flops_per_token,
    weight_bytes,
)
from kvsim.models.dtypes import weight_dtype_bytes
from kvsim.models.sizing import kv_heads_per_rank


@dataclass(frozen=True, slots=True)
class _Group:
    window: int  # 0 = unbounded
    kv_bytes_per_token: float
    flops_per_pair: float  # decode form (MLA: absorbed latent attention)
    prefill_flops_per_pair: float  # prefill form (MLA: decompressed heads)
    state_bytes_per_seq: float
    q_per_kv: float  # query heads per KV head in prefill (MLA decompresses: 1)


def prefill_q_per_kv(group: LayerGroup, tp: int) -> float:
    """Query heads per KV head on one rank as prefill attention runs: GQA/MQA share each KV
    head among several query heads; MLA's prefill decompresses a K and V per head (1)."""
    if group.kind not in ("full", "sliding") or not group.num_heads or not group.num_kv_heads:
        return 1.0
    heads = max(1, group.num_heads // tp)
    return max(1.0, heads / kv_heads_per_rank(group.num_kv_heads, tp))


def compute_dtype_for(weight_dtype: str, profile: HardwareProfile) -> str:
    """The dtype matmuls run in: FP8 for FP8 weights where the GPU has an FP8 peak (W8A8),
    else BF16 (int8/int4 weights are dequantised into BF16 matmuls, W8A16 / W4A16)."""
    if weight_dtype == "fp8" and "fp8" in profile.gpu.peak_flops_per_s:
        return "fp8"
    return "bf16"


def gemm_kernels_per_iteration(model: ModelSpec) -> int:
    """Weight matmul kernels of one forward pass: two per attention layer (QKV, output), five
    per MLA layer (q_a, q_b, kv_a, kv_b, output), two per Mamba layer (in, out), two per dense
    MLP (gate-up, down), three per MoE MLP (router, grouped gate-up, grouped down; two more with
    shared experts), and the LM head."""
    count = 1
    for g in model.layer_groups:
        per = {"full": 2, "sliding": 2, "mla": 5 if g.q_lora_rank else 4}.get(g.kind, 2)
        count += g.layers * (per if g.kind != "none" else 0)
    for m in model.mlp_groups:
        count += m.layers * ((3 + (2 if m.num_shared_experts else 0)) if m.is_moe else 2)
    return count


def model_elementwise_bytes_per_token(model: ModelSpec, tp: int, dtype_bytes: float) -> float:
    """Elementwise bytes per token over all layers (kvsim.costmodel.kernels), per rank."""
    g = model.layer_groups[0]
    heads = max(1, g.num_heads // tp) if g.num_heads else 0
    if g.kind == "mla":
        q_width = heads * (g.qk_nope_head_dim + g.qk_rope_head_dim)
        kv_width = g.kv_lora_rank + g.qk_rope_head_dim
    else:
        q_width = heads * g.head_dim_k
        kv_width = kv_heads_per_rank(g.num_kv_heads, tp) * g.head_dim_k if g.num_kv_heads else 0
    m = model.mlp_groups[0] if model.mlp_groups else None
    inter = 0
    if m is not None:
        per_token = m.experts_per_token if m.is_moe else 1
        inter = max(1, m.intermediate_size * max(per_token, 1) // tp)
    per_layer = elementwise_bytes_per_token(
        model.hidden_size, q_width, kv_width, inter, True, dtype_bytes
    )
    return per_layer * model.num_layers


#: batch shapes whose `linear_s` a cost model remembers before starting afresh
_LINEAR_MEMO_SIZE = 1 << 16


class RooflineCostModel(ChunkedPrefill):
    """Turns a batch (prefill chunks with their context, decode contexts) into seconds."""

    kind = "roofline"  # kvsim.costmodel.measured.MeasuredCostModel says "measured"
    reason = "datasheet roofline"  # why this model was chosen, for the run summary

    def __init__(
        self,
        model: ModelSpec,
        profile: HardwareProfile,
        *,
        tp: int = 1,
        kv_dtype: str = "bf16",
        weight_dtype: str = "bf16",
        compute_dtype: str | None = None,
        engine: EngineProfile | None = None,
    ) -> None:
        self.engine = engine
        self._linear_memo: dict[tuple[int, int], float] = {}
        self.kernel_terms = kernel_terms_note(profile, engine)
        profile = under_engine(profile, engine)
        compute_dtype = compute_dtype or compute_dtype_for(weight_dtype, profile)
        if compute_dtype not in profile.gpu.peak_flops_per_s:
            compute_dtype = "bf16"
        self.compute_dtype = compute_dtype
        self.rates = KernelRates.of(profile, compute_dtype)
        eff = profile.efficiency
        self.overhead_s = eff.iteration_overhead_s or 0.0
        # API server, tokenisation, detokenisation: paid once per request, outside iterations
        self.request_overhead_s = eff.request_overhead_s or 0.0
        self.tp = tp
        self.layers = model.num_layers
        # every weight is read once per iteration, except the embedding table: a lookup reads
        # only the rows of the batch's tokens (with tied embeddings the LM head reads it all)
        lookup = 0 if model.tie_word_embeddings else model.embedding_params
        self.weight_bytes = float(weight_bytes(model, weight_dtype, tp)) - lookup * (
            weight_dtype_bytes(weight_dtype) / tp
        )
        # logits are computed for each sequence's last token only (vLLM, SGLang), not per token
        self.lm_head_flops_per_seq = 2.0 * model.hidden_size * model.vocab_size / tp
        self.linear_flops_per_token = (
            float(linear_flops_per_token(model, tp)) - self.lm_head_flops_per_seq
        )
        self.gemm_kernels = gemm_kernels_per_iteration(model)
        self.elementwise_kernels = ELEMENTWISE_KERNELS_PER_LAYER * model.num_layers
        self.elementwise_bytes_per_token = model_elementwise_bytes_per_token(model, tp, 2.0)
        self.allreduce_calls = 2 * model.num_layers if tp > 1 else 0
        self.allreduce_bytes_per_token = model.hidden_size * 2.0  # bf16 activations
        costs = attention_costs(model, kv_dtype, tp)
        attending = [g for g in model.layer_groups if g.kind != "none"]  # as attention_costs
        self.groups = tuple(
            _Group(
                window=int(c.window or 0),
                kv_bytes_per_token=float(c.kv_bytes_per_token),
                flops_per_pair=float(c.flops_per_token_pair),
                prefill_flops_per_pair=float(c.prefill_flops_per_token_pair),
                state_bytes_per_seq=float(c.state_bytes_per_seq),
                q_per_kv=prefill_q_per_kv(group, tp),
            )
            for c, group in zip(costs, attending, strict=True)
        )
        self.attention_layers = sum(c.layers for c in costs)
        self.windowed = any(g.window for g in self.groups)
        self.kv_bytes_per_token = sum(g.kv_bytes_per_token for g in self.groups)
        self.flops_per_pair = sum(g.flops_per_pair for g in self.groups)
        self.state_bytes_per_seq = sum(g.state_bytes_per_seq for g in self.groups)
        self.kernels_per_iteration = (
            self.gemm_kernels + self.elementwise_kernels + self.attention_layers
        ) + self.allreduce_calls
        self.clock = IterationClock.of(engine, self.overhead_s, self.kernels_per_iteration)
        # no overlap and no launch floor: an iteration is GPU + CPU time, added as before
        self.plain_clock = engine is None or not (
            engine.overlap_scheduling or engine.eager_launch_s
        )

    # -- the parts of an iteration ------------------------------------------------------------
    def linear_s(self, tokens: float | np.ndarray, sequences: float | np.ndarray):
        """Weight matmuls, elementwise passes and all-reduces of ``tokens`` scheduled tokens of
        ``sequences`` sequences (the LM head runs once per sequence)."""
        r = self.rates
        flops = self.linear_flops_per_token * tokens + self.lm_head_flops_per_seq * sequences
        t = r.gemm_s(flops, self.weight_bytes, self.gemm_kernels)
        t = t + r.elementwise_s(
            as_float(tokens) * self.elementwise_bytes_per_token, self.elementwise_kernels
        )
        return t + self.allreduce_iteration_s(tokens)

    def _linear_at(self, tokens: int, sequences: int):
        """`linear_s` of one iteration, remembered: a fleet prices the same batch shapes over
        and over (pricing coalesced decode runs took a seventh of a 1 M-request run's CPU)."""
        memo = self._linear_memo
        t = memo.get((tokens, sequences))
        if t is None:
            if len(memo) >= _LINEAR_MEMO_SIZE:
                memo.clear()
            t = memo[tokens, sequences] = self.linear_s(tokens, sequences)
        return t

    def allreduce_iteration_s(self, tokens: float | np.ndarray):
        """The tensor-parallel all-reduces of one iteration: two per layer (after attention and
        after the MLP) of every token's hidden state."""
        if not self.allreduce_calls:
            return 0.0 if np.ndim(tokens) == 0 else np.zeros(np.shape(tokens))
        nbytes = as_float(tokens) * self.allreduce_bytes_per_token
        return self.allreduce_calls * self.rates.allreduce_s(nbytes, self.tp)

    def _prefill_pairs_and_reads(self, new: int, context: int) -> tuple[float, float]:
        """(attention FLOPs, KV bytes read+written) of a chunk of `new` tokens after `context`;
        the FLOPs at the rate long chunks reach (KernelRates.prefill_flops_at_peak_rate)."""
        flops = 0.0
        kv = 0.0
        for g in self.groups:
            if g.window and context + new > g.window:
                # each query i attends min(context + i + 1, window) keys
                pairs = windowed_pairs(context, new, g.window)
                read = min(context, g.window)
            else:
                pairs = new * context + new * (new + 1) / 2
                read = context
            cached = min(pairs, float(new * read))  # the pairs against cached keys
            flops += self.rates.prefill_flops_at_peak_rate(
                pairs, g.prefill_flops_per_pair, new, cached, g.q_per_kv
            )
            kv += (read + new) * g.kv_bytes_per_token + g.state_bytes_per_seq
        return flops, kv

    def _decode_work(self, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Attention FLOPs and KV bytes of decode steps; `contexts` is (steps, sequences)."""
        n = contexts.shape[1]
        flops = np.zeros(contexts.shape[0])
        nbytes = np.zeros(contexts.shape[0])
        for g in self.groups:
            keys = np.minimum(contexts, g.window) if g.window else contexts
            attended = keys.sum(axis=1) + n  # each sequence also attends its new token
            flops += attended * g.flops_per_pair
            nbytes += attended * g.kv_bytes_per_token + n * g.state_bytes_per_seq
        return flops, nbytes

    def _decode_step_work(
        self, contexts: Sequence[float] | np.ndarray, total: float | None = None
    ) -> tuple[float, float]:
        """`_decode_work` of one step, in Python floats: a group without a window needs only
        the summed context (`total` when the caller has it; else `summed`, whose bits are
        those `_decode_work` gets)."""
        n = len(contexts)
        if total is None:
            total = summed(contexts)
        array = np.asarray(contexts, dtype=np.float64) if self.windowed else None
        flops = 0.0
        nbytes = 0.0
        for g in self.groups:
            if g.window:
                attended = float(np.minimum(array, g.window).sum()) + n  # type: ignore[arg-type]
            else:
                attended = float(total) + n
            flops += attended * g.flops_per_pair
            nbytes += attended * g.kv_bytes_per_token + n * g.state_bytes_per_seq
        return flops, nbytes

    def _attention_s(self, flops, nbytes):
        """All prefill chunks and decode sequences of an iteration go into one attention
        kernel per layer (vLLM v1's unified varlen FlashAttention call)."""
        return self.rates.attention_s(flops, nbytes, self.attention_layers)

    # -- the engine's calls -------------------------------------------------------------------
    def iteration_time_s(
        self,
        prefill: list[tuple[int, int]],
        decode_contexts: Sequence[float] | np.ndarray,
        decode_total: float | None = None,
    ) -> float:
        """Seconds for one iteration: `prefill` is (new tokens, cached context before them) per
        chunk; `decode_contexts` the context (tokens already in KV) of each decoding sequence.
        `decode_total`: what they read, summed, when that is not their sum (a compression's
        equivalent tokens, kvsim.engine.compress); only for a model without windows."""
        tokens = sum(n for n, _ in prefill) + len(decode_contexts)
        if tokens == 0:
            return self.overhead_s
        flops = 0.0
        nbytes = 0.0
        for new, context in prefill:
            f, b = self._prefill_pairs_and_reads(new, context)
            flops += f
            nbytes += b
        sequences = len(prefill) + len(decode_contexts)
        if self.rates.splits_attention:
            df, db = (0.0, 0.0)
            if len(decode_contexts):
                df, db = self._decode_step_work(decode_contexts, decode_total)
            n, layers = len(decode_contexts), self.attention_layers
            if not prefill:
                attention = self.rates.decode_attention_s(df, db, layers, n)
            else:
                attention = self.rates.mixed_attention_s(flops, nbytes, df, db, layers, n)
            gpu = float(self._linear_at(tokens, sequences) + attention)
            return self.clock.seconds(gpu, tokens)
        if len(decode_contexts):
            f, b = self._decode_step_work(decode_contexts, decode_total)
            flops += f
            nbytes += b
        t = self._linear_at(tokens, sequences) + self._attention_s(flops, nbytes)
        if self.plain_clock:
            return float(t) + self.overhead_s
        return self.clock.seconds(float(t), tokens)

    def decode_run_ends_s(
        self,
        contexts: np.ndarray | list[int],
        steps: int,
        growth: float | None = None,
        total: float | None = None,
    ) -> np.ndarray:
        """Cumulative end times of `steps` consecutive decode iterations of an unchanged batch
        whose sequences start at `contexts`; each step adds one token to every context, or,
        given `growth`, that many tokens to the batch's summed context (a KV compression's
        attention reads: kvsim.engine.compress), which starts at `total` if given."""
        n = len(contexts)
        offsets = np.arange(steps, dtype=np.float64)
        if growth is not None:
            start = summed(contexts) if total is None else total
            attended = start + growth * offsets + n
            flops = attended * self.flops_per_pair
            nbytes = attended * self.kv_bytes_per_token + n * self.state_bytes_per_seq
        elif self.windowed:
            work = np.asarray(contexts, dtype=np.float64)[None, :] + offsets[:, None]
            flops, nbytes = self._decode_work(work)
        else:
            # no window: attention work is linear in the summed context, so avoid the matrix
            attended = summed(contexts) + n * offsets + n
            flops = attended * self.flops_per_pair
            nbytes = attended * self.kv_bytes_per_token + n * self.state_bytes_per_seq
        if self.rates.splits_attention:
            attention = self.rates.decode_attention_s(flops, nbytes, self.attention_layers, n)
        else:
            attention = self._attention_s(flops, nbytes)
        if self.plain_clock:
            fixed = float(self._linear_at(n, n)) + self.overhead_s
            return (fixed + attention).cumsum()
        return self.clock.steps(float(self._linear_at(n, n)) + attention, n).cumsum()

    def block_recompute_s(self, block_size: int) -> tuple[float, float]:
        """(base, per position) seconds to recompute one block as part of a prefill, so the
        block at chain position p costs base + per_position * p. Prefill is compute-bound, so
        this counts FLOPs: the block's linear layers, and its attention to everything before it
        (which grows with p: deep blocks cost more, the premise of AsymCache)."""
        r = self.rates
        pairs_within = block_size * (block_size + 1) / 2
        base = (self.linear_flops_per_token * block_size) / r.gemm_flops_per_s
        prefill_pair = sum(g.prefill_flops_per_pair for g in self.groups)
        base += pairs_within * prefill_pair / r.attention_flops_per_s
        per_position = block_size * block_size * prefill_pair / r.attention_flops_per_s
        return base, per_position

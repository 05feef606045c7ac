"""Iteration time of one forward pass of a batch: a roofline over the hardware profile.

An iteration is memory-bound or compute-bound, whichever takes longer (Williams et al., "Roofline",
CACM 2009), plus tensor-parallel all-reduces and a fixed per-iteration overhead:

    t = max(flops / (peak * eff_compute), bytes / (hbm_bw * eff_memory)) + t_allreduce + t_fixed

- flops: 2 x active parameters per token (every scheduled token), plus attention: one FLOP count
  per (query token, cached key token) pair, over each layer group's window.
- bytes: all weights of a rank once per iteration, plus the KV every sequence reads (its context
  within each group's window) and writes (its new tokens), plus fixed linear/Mamba state.
- t_allreduce: two all-reduces per layer of hidden x tokens x 2 bytes, moved as a ring
  (2 (tp-1)/tp of the payload) over the GPU interconnect.

Efficiencies and the overhead come from the profile; measured tables from calibration replace this
model when a profile carries them (``kvsim.hardware.measured.make_cost_model``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec, attention_costs, linear_flops_per_token, weight_bytes


@dataclass(frozen=True, slots=True)
class _Group:
    window: int  # 0 = unbounded
    kv_bytes_per_token: float
    flops_per_pair: float  # decode form (MLA: absorbed latent attention)
    prefill_flops_per_pair: float  # prefill form (MLA: decompressed heads)
    state_bytes_per_seq: float


class ChunkedPrefill:
    """`prefill_time_s` for any cost model that prices one iteration."""

    def iteration_time_s(
        self, prefill: list[tuple[int, int]], decode_contexts: list[int] | np.ndarray
    ) -> float:
        raise NotImplementedError

    def prefill_time_s(self, tokens: int, context: int = 0, chunk: int | None = None) -> float:
        """Seconds to prefill `tokens` after `context` alone, in chunks of at most `chunk`."""
        chunk = chunk or tokens
        total = 0.0
        done = 0
        while done < tokens:
            n = min(chunk, tokens - done)
            total += self.iteration_time_s([(n, context + done)], [])
            done += n
        return total


class RooflineCostModel(ChunkedPrefill):
    """Turns a batch (prefill chunks with their context, decode contexts) into seconds."""

    kind = "roofline"  # kvsim.hardware.measured.MeasuredCostModel says "measured"
    reason = "datasheet roofline"  # why this model was chosen, for the run summary

    def __init__(
        self,
        model: ModelSpec,
        profile: HardwareProfile,
        *,
        tp: int = 1,
        kv_dtype: str = "bf16",
        weight_dtype: str = "bf16",
        compute_dtype: str = "bf16",
    ) -> None:
        gpu = profile.gpu
        if compute_dtype not in gpu.peak_flops_per_s:
            compute_dtype = "bf16"
        eff = profile.efficiency
        self.flops_per_s = gpu.peak_flops_per_s[compute_dtype] * eff.compute
        self.bytes_per_s = gpu.hbm_bandwidth_bytes_per_s * eff.memory
        self.overhead_s = eff.iteration_overhead_s
        self.weight_bytes = float(weight_bytes(model, weight_dtype, tp))
        self.linear_flops_per_token = float(linear_flops_per_token(model, tp))
        self.groups = tuple(
            _Group(
                window=int(c.window or 0),
                kv_bytes_per_token=float(c.kv_bytes_per_token),
                flops_per_pair=float(c.flops_per_token_pair),
                prefill_flops_per_pair=float(c.prefill_flops_per_token_pair),
                state_bytes_per_seq=float(c.state_bytes_per_seq),
            )
            for c in attention_costs(model, kv_dtype, tp)
        )
        self.windowed = any(g.window for g in self.groups)
        self.kv_bytes_per_token = sum(g.kv_bytes_per_token for g in self.groups)
        self.flops_per_pair = sum(g.flops_per_pair for g in self.groups)
        self.state_bytes_per_seq = sum(g.state_bytes_per_seq for g in self.groups)
        # all-reduce seconds per token: 2 per layer, hidden x 2 bytes (bf16 activations)
        if tp > 1:
            payload = 2 * model.num_layers * model.hidden_size * 2.0
            self.allreduce_s_per_token = (
                payload * 2 * (tp - 1) / tp / gpu.interconnect_bandwidth_bytes_per_s
            )
        else:
            self.allreduce_s_per_token = 0.0

    # -- attention work ------------------------------------------------------------------------
    def _prefill_pairs_and_reads(self, new: int, context: int) -> tuple[float, float]:
        """(attention FLOPs, KV bytes read+written) of a chunk of `new` tokens after `context`."""
        flops = 0.0
        kv = 0.0
        for g in self.groups:
            if g.window and context + new > g.window:
                # each query i attends min(context + i + 1, window) keys
                pairs = _windowed_pairs(context, new, g.window)
                read = min(context, g.window)
            else:
                pairs = new * context + new * (new + 1) / 2
                read = context
            flops += pairs * g.prefill_flops_per_pair
            kv += (read + new) * g.kv_bytes_per_token + g.state_bytes_per_seq
        return flops, kv

    def iteration_time_s(
        self, prefill: list[tuple[int, int]], decode_contexts: list[int] | np.ndarray
    ) -> float:
        """Seconds for one iteration: `prefill` is (new tokens, cached context before them) per
        chunk; `decode_contexts` the context (tokens already in KV) of each decoding sequence."""
        tokens = sum(n for n, _ in prefill) + len(decode_contexts)
        flops = self.linear_flops_per_token * tokens
        nbytes = self.weight_bytes
        for new, context in prefill:
            f, b = self._prefill_pairs_and_reads(new, context)
            flops += f
            nbytes += b
        if len(decode_contexts):
            f, b = self._decode_work(np.asarray(decode_contexts, dtype=np.float64)[None, :])
            flops += float(f[0])
            nbytes += float(b[0])
        return self._time(flops, nbytes, tokens)

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

    def _time(self, flops: float | np.ndarray, nbytes: float | np.ndarray, tokens: int):
        compute = flops / self.flops_per_s
        memory = nbytes / self.bytes_per_s
        return np.maximum(compute, memory) + tokens * self.allreduce_s_per_token + self.overhead_s

    def decode_run_ends_s(self, contexts: np.ndarray, steps: int) -> np.ndarray:
        """Cumulative end times of `steps` consecutive decode iterations of an unchanged batch
        whose sequences start at `contexts`; each step adds one token to every context."""
        n = len(contexts)
        offsets = np.arange(steps, dtype=np.float64)
        if self.windowed:
            work = contexts[None, :].astype(np.float64) + offsets[:, None]
            flops, nbytes = self._decode_work(work)
        else:
            # no window: attention work is linear in the summed context, so avoid the matrix
            attended = float(contexts.sum()) + n * offsets + n
            flops = attended * self.flops_per_pair
            nbytes = attended * self.kv_bytes_per_token + n * self.state_bytes_per_seq
        flops = flops + self.linear_flops_per_token * n
        nbytes = nbytes + self.weight_bytes
        return np.cumsum(self._time(flops, nbytes, n))

    def block_recompute_s(self, block_size: int) -> tuple[float, float]:
        """(base, per position) seconds to recompute one block as part of a prefill, so the
        block at chain position p costs base + per_position * p. Prefill is compute-bound, so
        this counts FLOPs: the block's linear layers, and its attention to everything before it
        (which grows with p: deep blocks cost more, the premise of AsymCache)."""
        pairs_within = block_size * (block_size + 1) / 2
        base = (self.linear_flops_per_token * block_size) / self.flops_per_s
        prefill_pair = sum(g.prefill_flops_per_pair for g in self.groups)
        base += pairs_within * prefill_pair / self.flops_per_s
        per_position = block_size * block_size * prefill_pair / self.flops_per_s
        return base, per_position


def _windowed_pairs(context: int, new: int, window: int) -> float:
    """Sum over i in [0, new) of min(context + i + 1, window)."""
    # queries whose attended span is still growing: context + i + 1 < window
    growing = max(0, min(new, window - context - 1))
    pairs = growing * (context + 1) + growing * (growing - 1) / 2
    return pairs + (new - growing) * window

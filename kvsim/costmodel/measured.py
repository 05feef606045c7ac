"""Iteration times from calibration: a profile's measured tables, interpolated as rates.

An iteration is the sum of its parts, as in Vidur: per-layer GEMMs at the batch's token count,
the LM head per sequence, per-layer elementwise work, prefill attention per chunk, decode
attention at (batch, mean context), tensor-parallel all-reduces (a measured curve of seconds
vs bytes when the profile has one, else the roofline of kvsim.costmodel.kernels), and a fixed
overhead. Each part is a measured curve (kvsim.costmodel.interpolate) that relaxes to its
family's roofline (kvsim.costmodel.family_rooflines) outside the measured sizes. Tables belong
to one model, TP degree and dtype (``mismatch`` says why they do not apply).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvsim.costmodel.chunked_prefill import ChunkedPrefill
from kvsim.costmodel.engine_terms import IterationClock
from kvsim.costmodel.family_rooflines import LayerAttention, elementwise_roofline, gemm_roofline
from kvsim.costmodel.interpolate import RateCurve, RateGrid, Roofline, rate_curve
from kvsim.costmodel.kernels import allreduce_s, summed
from kvsim.costmodel.roofline import RooflineCostModel
from kvsim.costmodel.shapes import supported
from kvsim.engines import EngineProfile
from kvsim.errors import ConfigError
from kvsim.hardware.attention_pairs import causal_pairs, windowed_pairs
from kvsim.hardware.measured_tables import (
    MeasuredTables,
    PrefillTable,
    parse_measured,
    raise_config_error,
)
from kvsim.hardware.profile import HardwareProfile
from kvsim.models import ModelSpec
from kvsim.models.dtypes import weight_dtype_bytes

#: Formats whose kernels run at the same speed (same bytes, same tensor-core peak on every GPU
#: kvsim ships): tables measured in one price the other.
_SAME_SPEED = ({"fp16", "bf16"},)


def _prefill_curve(table: PrefillTable, roofline: Roofline) -> RateCurve:
    """A prefill table as a curve over (query, key) pairs, so any chunk shape reads it."""
    return RateCurve(np.array(table.pairs), np.array(table.seconds), roofline)


class MeasuredCostModel(ChunkedPrefill):
    """Iteration times from a calibrated profile; same calls as ``RooflineCostModel``."""

    kind = "measured"

    def __init__(
        self,
        model: ModelSpec,
        profile: HardwareProfile,
        *,
        tp: int = 1,
        kv_dtype: str = "bf16",
        weight_dtype: str = "bf16",
        tables: MeasuredTables | None = None,
        engine: EngineProfile | None = None,
    ) -> None:
        tables = tables or parse_measured(profile.measured, raise_config_error)
        reason = mismatch(tables, model, tp, kv_dtype, weight_dtype)
        if reason:
            raise ConfigError(f"measured tables do not apply: {reason}")
        self.tables = tables
        source = tables.extra.get("source")
        if source:  # imported tables (kvsim calibrate import-vidur) say whose measurements
            self.reason = f"measured by {source} on {tables.device}"
        else:
            self.reason = f"measured on {tables.device} ({tables.date})"
        self.roofline = RooflineCostModel(
            model, profile, tp=tp, kv_dtype=kv_dtype, weight_dtype=weight_dtype, engine=engine
        )
        self.kernel_terms = f"{profile.name} [measured]"
        rates = self.roofline.rates  # the roofline's kernel terms, at its compute dtype
        wbytes = weight_dtype_bytes(weight_dtype)
        self.layers = model.num_layers
        self.gemm = [
            (g.calls, g.per == "sequence", rate_curve(g.curve, gemm_roofline(g, rates, wbytes)))
            for g in tables.gemm.values()
        ]
        self.elementwise = rate_curve(tables.elementwise, elementwise_roofline(model, tp, rates))
        att = LayerAttention(model, tp, kv_dtype)
        self.att = att
        self.prefill = _prefill_curve(tables.prefill, att.prefill_roofline(rates))
        cached = tables.prefill_cached or tables.prefill
        self.prefill_cached = _prefill_curve(cached, att.prefill_roofline(rates))
        d = tables.decode
        self.decode = RateGrid(
            np.array(d.batch), np.array(d.context), np.array(d.seconds), att.decode_roofline(rates)
        )
        # the tables' CPU time per iteration; the engine says whether it overlaps the GPU's
        # (measured tables replay graphs' kernel times: no eager launch floor is added)
        self.overhead_s = tables.overhead_s
        self.request_overhead_s = self.roofline.request_overhead_s
        overlap = engine is not None and engine.overlap_scheduling
        self.clock = IterationClock(self.overhead_s, overlap)
        self.tp = tp
        # two all-reduces per layer (after attention, after the MLP) of tokens x hidden x 2 bytes
        self.allreduce_calls = 2 * model.num_layers
        self.allreduce_bytes_per_token = model.hidden_size * 2.0
        algorithms = self.roofline.rates.allreduce  # the engine's, when it names them
        self.allreduce_roofline: Roofline = lambda b: np.asarray(allreduce_s(algorithms, b, tp))
        self.allreduce = (
            rate_curve(tables.allreduce, self.allreduce_roofline)
            if tables.allreduce is not None and tp > 1
            else None
        )
        self.windowed = self.roofline.windowed

    # -- parts ----------------------------------------------------------------------------------
    def allreduce_time_s(self, tokens: float | np.ndarray) -> np.ndarray:
        """The iteration's tensor-parallel all-reduces: the measured curve where the profile has
        one (relaxing to the roofline outside it), else latency + bytes / bandwidth."""
        tokens = np.asarray(tokens, dtype=np.float64)
        if self.tp <= 1:
            return np.zeros_like(tokens)
        nbytes = np.maximum(tokens * self.allreduce_bytes_per_token, 1.0)
        curve = self.allreduce
        per_call = curve(nbytes) if curve is not None else self.allreduce_roofline(nbytes)
        return self.allreduce_calls * per_call

    def linear_time_s(self, tokens: float | np.ndarray, sequences: float | np.ndarray):
        """GEMMs, elementwise work and all-reduces of a batch of ``tokens`` in ``sequences``."""
        total = self.layers * self.elementwise(tokens)
        for calls, per_sequence, curve in self.gemm:
            total = total + calls * curve(sequences if per_sequence else tokens)
        return total + self.allreduce_time_s(tokens)

    def prefill_attention_s(self, new: int, context: int) -> float:
        """One chunk's attention over every attention layer."""
        curve = self.prefill_cached if context > 0 else self.prefill
        total = 0.0
        for layers, window, fpp, _, _ in self.att.groups:
            if window and context + new > window:
                pairs = windowed_pairs(context, new, window)
            else:
                pairs = causal_pairs(new, context)
            scale = fpp / self.att.prefill_fpp if self.att.prefill_fpp else 1.0
            total += layers * scale * float(curve(pairs))
        return total

    def decode_attention_s(self, contexts: np.ndarray) -> np.ndarray:
        """Decode attention of ``contexts`` (steps, sequences) over every attention layer."""
        batch = contexts.shape[1]
        total = np.zeros(contexts.shape[0])
        for layers, window, _, fpp, _ in self.att.groups:
            keys = np.minimum(contexts, window) if window else contexts
            mean = np.maximum(keys.mean(axis=1), 1.0)
            scale = fpp / self.att.decode_fpp if self.att.decode_fpp else 1.0
            total += layers * scale * self.decode(float(batch), mean)
        return total

    # -- the RooflineCostModel interface ------------------------------------------------------
    def iteration_time_s(
        self,
        prefill: list[tuple[int, int]],
        decode_contexts: Sequence[float] | np.ndarray,
        decode_total: float | None = None,
    ) -> float:
        """Seconds for one iteration; arguments as in ``RooflineCostModel.iteration_time_s``."""
        n_decode = len(decode_contexts)
        tokens = sum(n for n, _ in prefill) + n_decode
        if tokens == 0:
            return self.overhead_s
        total = float(self.linear_time_s(tokens, len(prefill) + n_decode))
        for new, context in prefill:
            total += self.prefill_attention_s(new, context)
        if n_decode and decode_total is not None:
            total += float(self._mean_decode_s(n_decode, np.array([decode_total / n_decode]))[0])
        elif n_decode:
            contexts = np.asarray(decode_contexts, dtype=np.float64)[None, :]
            total += float(self.decode_attention_s(contexts)[0])
        if self.clock.overlap:
            return self.clock.seconds(total, tokens)
        return total + self.overhead_s

    def _mean_decode_s(self, n: int, mean: np.ndarray) -> np.ndarray:
        """Decode attention of `n` sequences of each `mean` context, over every attention
        layer, for a model without windows."""
        attn = np.zeros(len(mean))
        for layers, _, _, fpp, _ in self.att.groups:
            scale = fpp / self.att.decode_fpp if self.att.decode_fpp else 1.0
            attn += layers * scale * self.decode(float(n), np.maximum(mean, 1.0))
        return attn

    def decode_run_ends_s(
        self,
        contexts: np.ndarray | list[int],
        steps: int,
        growth: float | None = None,
        total: float | None = None,
    ) -> np.ndarray:
        """Cumulative ends of ``steps`` decode iterations of an unchanged batch (``growth``:
        tokens the summed context gains per step, from ``total``, as in
        ``RooflineCostModel``)."""
        n = len(contexts)
        linear = float(self.linear_time_s(n, n))
        fixed = linear + self.overhead_s
        offsets = np.arange(steps, dtype=np.float64)
        if growth is not None:
            start = summed(contexts) / n if total is None else total / max(n, 1)
            attn = self._mean_decode_s(n, start + growth / max(n, 1) * offsets)
        elif self.windowed:
            work = np.asarray(contexts, dtype=np.float64)[None, :] + offsets[:, None]
            attn = self.decode_attention_s(work)
        else:
            attn = self._mean_decode_s(n, summed(contexts) / n + offsets)
        if self.clock.overlap:
            return np.cumsum(self.clock.steps(linear + attn, n))
        return np.cumsum(fixed + attn)

    def block_recompute_s(self, block_size: int) -> tuple[float, float]:
        """(base, per position) seconds to recompute one block inside a prefill, linearised
        from the measured prefill-attention table between context 0 and 64 blocks deep."""
        near = self.prefill_attention_s(block_size, 0)
        far = self.prefill_attention_s(block_size, 64 * block_size)
        base = float(self.linear_time_s(block_size, 1)) + near
        return base, max(far - near, 0.0) / 64


def mismatch(
    tables: MeasuredTables, model: ModelSpec, tp: int, kv_dtype: str, weight_dtype: str
) -> str | None:
    """Why ``tables`` cannot price ``model`` at this TP degree and dtypes (None if they can)."""
    if tables.model != model.name:
        return f"measured for model {tables.model!r}, not {model.name!r}"
    if tables.tp != tp:
        return f"measured at tp={tables.tp}, not tp={tp}"
    if not same_speed(tables.dtype, weight_dtype):
        return f"measured in {tables.dtype}, not weight dtype {weight_dtype}"
    if not same_speed(tables.kv_dtype, kv_dtype):
        return f"measured with kv dtype {tables.kv_dtype}, not {kv_dtype}"
    return supported(model)


def same_speed(measured: str, wanted: str) -> bool:
    """Whether kernels measured in dtype ``measured`` price dtype ``wanted`` (fp16 and bf16
    move the same bytes at the same tensor-core peak, so Vidur's fp16 tables price bf16 KV)."""
    return measured == wanted or any({measured, wanted} <= group for group in _SAME_SPEED)

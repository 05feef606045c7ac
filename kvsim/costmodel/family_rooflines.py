"""The roofline of each measured kernel family: what a measured curve relaxes to outside its range.

Outside the measured range each family relaxes to the same kernel terms as RooflineCostModel
(kvsim.costmodel.kernels: fixed cost per kernel, soft ridge, attention's and elementwise
efficiencies), so the two models agree where nothing was measured.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsim.costmodel.interpolate import Roofline
from kvsim.costmodel.kernels import ELEMENTWISE_KERNELS_PER_LAYER, KernelRates
from kvsim.costmodel.roofline import model_elementwise_bytes_per_token
from kvsim.costmodel.shapes import GemmShape
from kvsim.hardware.measured_tables import GemmTable
from kvsim.models import ModelSpec, attention_costs


def gemm_roofline(shape: GemmShape | GemmTable, rates: KernelRates, wbytes: float) -> Roofline:
    """Seconds of one ``m x k @ k x n`` kernel at ``m`` rows: its fixed cost plus the soft
    roofline of its FLOPs and its weight and activation traffic."""
    k, n = shape.k, shape.n

    def seconds(m: np.ndarray) -> np.ndarray:
        flops = 2.0 * m * k * n
        nbytes = (k * n + m * (k + n)) * wbytes
        return np.asarray(rates.gemm_s(flops, nbytes))

    return seconds


def elementwise_roofline(model: ModelSpec, tp: int, rates: KernelRates) -> Roofline:
    """Seconds of one layer's elementwise kernels at ``t`` tokens, as RooflineCostModel prices
    them (its bytes per token, bf16 activations, ``ELEMENTWISE_KERNELS_PER_LAYER`` kernels)."""
    per_layer = model_elementwise_bytes_per_token(model, tp, 2.0) / max(model.num_layers, 1)

    def seconds(t: np.ndarray) -> np.ndarray:
        return np.asarray(rates.elementwise_s(t * per_layer, ELEMENTWISE_KERNELS_PER_LAYER))

    return seconds


class LayerAttention:
    """Per-layer attention work of the model's attention shape: FLOPs and KV bytes."""

    def __init__(self, model: ModelSpec, tp: int, kv_dtype: str) -> None:
        costs = attention_costs(model, kv_dtype, tp)
        self.groups = [
            (
                c.layers,
                c.window or 0,
                c.prefill_flops_per_token_pair / c.layers,
                c.flops_per_token_pair / c.layers,
                c.kv_bytes_per_token / max(c.layers, 1),
            )
            for c in costs
        ]
        _, _, self.prefill_fpp, self.decode_fpp, self.kv_bpt = self.groups[0]
        g = model.layer_groups[0]
        heads = max(1, g.num_heads // tp)
        width = g.kv_lora_rank + g.qk_rope_head_dim if g.kind == "mla" else g.head_dim_k
        self.q_bytes_per_token = 2.0 * heads * width * 2  # query in, output out (bf16)

    def prefill_roofline(self, rates: KernelRates) -> Roofline:
        """Seconds of one layer vs pairs, for a prompt with no prefix (context = 0)."""

        def seconds(pairs: np.ndarray) -> np.ndarray:
            new = (np.sqrt(8 * pairs + 1) - 1) / 2  # invert pairs = new (new + 1) / 2
            flops = pairs * self.prefill_fpp
            nbytes = new * (self.kv_bpt + self.q_bytes_per_token)
            return np.asarray(rates.attention_s(flops, nbytes))

        return seconds

    def decode_roofline(self, rates: KernelRates) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """Seconds of one layer for ``batch`` sequences each attending ``context + 1`` keys."""

        def seconds(batch: np.ndarray, context: np.ndarray) -> np.ndarray:
            keys = batch * (context + 1)
            flops = keys * self.decode_fpp
            nbytes = keys * self.kv_bpt + batch * self.q_bytes_per_token
            return np.asarray(rates.attention_s(flops, nbytes))

        return seconds

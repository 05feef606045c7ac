"""A randomly initialised decoder of a catalog model's shape, to time real forward passes.

The end-to-end check of calibration: run one iteration (prefill chunks and decoding sequences
together, as continuous batching does) through every layer, and compare its time with the
simulator's prediction. Nothing is downloaded; timing does not depend on weight values. Full
and sliding-window GQA models with dense MLPs are supported; MLA and MoE are not (yet).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kvsim.calibrate.ops import (
    LayerWeights,
    attn_shape,
    decode_batch,
    gated_silu,
    prefill_chunk,
    randn,
    residual_norm,
    rms_norm,
    rope_qkv,
    rope_tables,
)
from kvsim.calibrate.plan import Batch
from kvsim.costmodel.shapes import supported
from kvsim.errors import ConfigError
from kvsim.models import ModelSpec


def _no_mark(_part: str) -> None:
    pass


class RandomDecoder:
    """Layers of random weights of ``model``'s per-rank shape; ``forward(batch)`` runs one
    iteration on caches filled beforehand (``prepare``), so only the forward is timed.

    ``layers`` builds fewer layers than the model has (calibration builds the few layers of
    its timed shapes, ``kvsim.calibrate.plan``): the forward pass runs them all, and the
    microbenchmarks run single layers of the first few, cycling through enough copies that
    each copy's weights and KV cache are as cold when it runs again as a layer's are in the
    whole forward pass.
    """

    def __init__(
        self,
        model: ModelSpec,
        tp: int,
        dtype: torch.dtype,
        device: Any,
        layers: int | None = None,
    ) -> None:
        reason = supported(model)
        if reason or model.layer_groups[0].kind == "mla":
            raise ConfigError(
                f"end-to-end forward: {reason or model.name + ': MLA'} is not supported"
            )
        self.model, self.dtype, self.device = model, dtype, device
        self.shape = attn_shape(model, tp)
        self.layers = [
            LayerWeights(model, self.shape, tp, dtype, device)
            for _ in range(layers or model.num_layers)
        ]
        vocab = max(1, model.vocab_size // tp)
        self.embedding = randn((vocab, model.hidden_size), dtype, device)
        self.lm_head = (
            self.embedding
            if model.tie_word_embeddings
            else randn((vocab, model.hidden_size), dtype, device)
        )
        self.final_norm = torch.ones(model.hidden_size, dtype=dtype, device=device)

    def prepare(self, batch: Batch, layers: int | None = None) -> dict[str, Any]:
        """Token ids, positions and per-layer KV caches (prefix filled) for ``batch``, for the
        first ``layers`` layers (default: all)."""
        s = self.shape
        window = s.window
        positions = []
        for new, ctx in batch.prefill:
            positions.append(torch.arange(ctx, ctx + new))
        positions.append(torch.full((batch.decode,), batch.decode_context))
        pos = torch.cat(positions).to(self.device)
        cos, sin = rope_tables(pos, s.head_dim)
        caches = []
        for _ in self.layers[: layers or len(self.layers)]:
            per = []
            for new, ctx in batch.prefill:
                kept = min(ctx, window) if window else ctx
                per.append(self._cache(1, kept + new))
            if batch.decode:
                kept = min(batch.decode_context, window) if window else batch.decode_context
                per.append(self._cache(batch.decode, kept + 1))
            caches.append(per)
        ids = torch.randint(0, self.embedding.shape[0], (batch.tokens,), device=self.device)
        return {"ids": ids, "cos": cos.to(self.dtype), "sin": sin.to(self.dtype), "caches": caches}

    def _cache(self, b: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.shape
        k = randn((b, s.kv_heads, length, s.head_dim), self.dtype, self.device, 1.0)
        v = randn((b, s.kv_heads, length, s.v_dim), self.dtype, self.device, 1.0)
        return k, v

    def layer(
        self,
        i: int,
        x: torch.Tensor,
        batch: Batch,
        state: dict[str, Any],
        mark: Callable[[str], None] = _no_mark,
    ) -> torch.Tensor:
        """Layer ``i`` on hidden states ``x`` of ``batch``; ``mark(part)`` is called after each
        op with the part it belongs to (a GEMM role, "elementwise" or "attention")."""
        s, window = self.shape, self.shape.window
        w, caches = self.layers[i], state["caches"][i]
        cos, sin = state["cos"], state["sin"]
        h = rms_norm(x, w.norm1)
        mark("elementwise")
        qkv = F.linear(h, w.qkv, w.qkv_bias)
        mark("qkv")
        q, k, v = rope_qkv(qkv, cos, sin, s)
        mark("elementwise")
        outs = []
        start = 0
        for j, (new, ctx) in enumerate(batch.prefill):
            kept = min(ctx, window) if window else ctx
            kc, vc = caches[j]
            end = start + new
            outs.append(prefill_chunk(q[start:end], k[start:end], v[start:end], kc, vc, kept))
            start = end
        if batch.decode:
            kept = min(batch.decode_context, window) if window else batch.decode_context
            kc, vc = caches[-1]
            outs.append(decode_batch(q[start:], k[start:], v[start:], kc, vc, kept))
        attn = outs[0] if len(outs) == 1 else torch.cat(outs)
        mark("attention")
        o = F.linear(attn, w.o)
        mark("o")
        x, h = residual_norm(x, o, w)
        mark("elementwise")
        gate_up = F.linear(h, w.gate_up)
        mark("gate_up")
        act = gated_silu(gate_up)
        mark("elementwise")
        down = F.linear(act, w.down)
        mark("down")
        x = x + down
        mark("elementwise")
        return x

    @torch.inference_mode()
    def forward(self, batch: Batch, state: dict[str, Any]) -> torch.Tensor:
        """Logits of the last token of every sequence after one iteration of ``batch``."""
        x = F.embedding(state["ids"], self.embedding)
        for i in range(len(self.layers)):
            x = self.layer(i, x, batch, state)
        ends = []
        total = 0
        for new, _ in batch.prefill:
            total += new
            ends.append(total - 1)
        last = torch.tensor(ends, dtype=torch.long, device=self.device)
        rows = torch.cat((x[last], x[total:])) if batch.prefill else x
        return F.linear(rms_norm(rows, self.final_norm), self.lm_head)

"""``lkv``: learned per-head budgets, taken as one retention ratio per layer (or one for all).

Zhou et al., arXiv 2605.06676: near-lossless on LongBench at 15 % retention. Its budgets are
learned per head; we take one ratio per KV layer (the mean over its heads). A prompt-only
profile: ``⌈ratio_l · prompt⌉`` plus every generated token. The learned scorer's cost is not
published (priced at 0); the selection is one top-k per KV head.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from kvsim.compression.base import Compression, Key, WorkAdder, pick

if TYPE_CHECKING:
    from kvsim.compression.sizing import LayerBytes


class LKV(Compression):
    name = "lkv"
    summary = "learned per-head budgets; a retention ratio per layer (one ratio or a list)"
    source = "LKV, Zhou et al., arXiv 2605.06676"
    keys: ClassVar[Mapping[str, Key]] = {
        "ratio": Key(
            "ratios",
            (Fraction(3, 20),),
            "Retention ratio of the prompt: one for every layer, or one per KV layer "
            "separated by '/' (LKV: near-lossless on LongBench at 15 %).",
        ),
    }
    drops_tokens = True
    prompt_only = True
    work_notes = ("lkv: the learned scorer's cost is not published; priced at 0",)
    unpublished = (
        "LKV (arXiv 2605.06676): only its abstract was found ('near-lossless performance with "
        "only 15% KV cache retention' on LongBench/RULER), with no score"
    )

    @property
    def layer_count(self) -> int | None:
        ratios = self.param("ratio")
        return len(ratios) if len(ratios) > 1 else None

    def keep_ratio(self, layer: int | None) -> Fraction:
        ratios: tuple[Fraction, ...] = self.param("ratio")
        if layer is None:
            return sum(ratios, Fraction(0)) / len(ratios)
        return pick(ratios, layer, self.name, "ratio")

    def keep(self, tokens: int, layer: int | None) -> int:
        return math.ceil(self.keep_ratio(layer) * tokens)

    def add_layer_work(
        self, add: WorkAdder, layer: int, lb: LayerBytes, q_heads: int, key_dims: int
    ) -> None:
        add("select_items_per_prompt_token", lb.heads)

"""``kvp``: a per-head ranking learned from K and V, with nested kept sets across budgets.

Moschella et al., arXiv 2602.10238. The budget is held over the whole context as H2O's is; 0.2 is
**our** default (the paper evaluates many budgets). The learned scorer's cost is not published
(priced at 0); the selection is one top-k per KV head after prefill.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from kvsim.compression.base import Compression, Key, WorkAdder, amount_tokens

if TYPE_CHECKING:
    from kvsim.compression.sizing import LayerBytes


class KVP(Compression):
    name = "kvp"
    summary = "per-head learned ranking from K and V; nested kept sets across budgets"
    source = "KVP, Moschella et al., arXiv 2602.10238"
    keys: ClassVar[Mapping[str, Key]] = {
        "budget": Key(
            "amount",
            Fraction(1, 5),
            "Cache budget: a ratio of the context or tokens (our default 20 %, the same as "
            "H2O's; not a KVP figure).",
        ),
    }
    drops_tokens = True
    work_notes = ("kvp: the learned scorer's cost is not published; priced at 0",)
    unpublished = (
        "KVP (arXiv 2602.10238): a full-text copy was searched; its quality results (RULER-4k, "
        "OASST2-4k perplexity, BoolQ, ARC-C, GovReport on Qwen2.5-7B-Chat; Phi-4 in the "
        "appendix) are plots only, with no numeric table"
    )

    def keep(self, tokens: int, layer: int | None) -> int:
        return amount_tokens(self.param("budget"), tokens)

    def add_layer_work(
        self, add: WorkAdder, layer: int, lb: LayerBytes, q_heads: int, key_dims: int
    ) -> None:
        add("select_items_per_prompt_token", lb.heads)

"""``h2o``: heavy hitters (accumulated attention) plus recent tokens under a cache budget.

Zhang et al., arXiv 2306.14048. The budget is a ratio of the context or a token count, held over
the whole context; ``recent`` splits it between heavy-hitter and recent tokens, which changes
quality, not bytes. Each decode step accumulates every read token's attention probability and
evicts the lowest score per KV head.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from kvsim.compression.base import (
    Amount,
    Compression,
    Key,
    WorkAdder,
    amount_text,
    amount_tokens,
)
from kvsim.errors import ConfigError

if TYPE_CHECKING:
    from kvsim.compression.sizing import LayerBytes


class H2O(Compression):
    name = "h2o"
    summary = "heavy hitters (accumulated attention) plus recent tokens under a cache budget"
    source = "H2O, Zhang et al., arXiv 2306.14048"
    keys: ClassVar[Mapping[str, Key]] = {
        "budget": Key(
            "amount",
            Fraction(1, 5),
            "Cache budget: a ratio of the context (with a decimal point) or tokens "
            "(an integer); H2O's headline budget is 20 %.",
        ),
        "recent": Key(
            "amount",
            None,
            "Recent-window part of the budget (default: half of it, H2O's equal split of "
            "heavy-hitter and recent tokens); it changes quality, not bytes.",
        ),
    }
    drops_tokens = True

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> Compression:
        budget = values.get("budget", cls.keys["budget"].default)
        recent = values.get("recent")
        if recent is None:
            recent = budget / 2 if isinstance(budget, Fraction) else max(1, budget // 2)
        if type(recent) is type(budget) and recent > budget:
            raise ConfigError(
                f"compression h2o: recent={amount_text(recent)} exceeds budget="
                f"{amount_text(budget)}; the recent window is part of the budget"
            )
        return cls.build({"budget": budget, "recent": recent})

    def keep(self, tokens: int, layer: int | None) -> int:
        return amount_tokens(self.param("budget"), tokens)

    def add_layer_work(
        self, add: WorkAdder, layer: int, lb: LayerBytes, q_heads: int, key_dims: int
    ) -> None:
        # one accumulation of the attention probability per query head (our assumption that
        # the kernel emits the probabilities), the lowest score per KV head evicted
        add("score_flops_per_read_token", q_heads)
        add("select_items_per_read_token", lb.heads)

    def quality_budget(self) -> tuple[Amount, str]:
        budget = self.param("budget")
        shown = f"{float(budget):g}" if isinstance(budget, Fraction) else str(budget)
        return budget, f"budget={shown}"

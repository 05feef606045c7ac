"""``snapkv``: an observation window at the end of the prompt votes for the prompt tokens to keep.

Li et al., arXiv 2404.14469. After prefill each KV head keeps the top-k prompt tokens plus the
window, ``capacity = k + w`` ("KV size"), and every generated token (memory per head = k + w +
generated): a prompt-only profile. Scoring is the window's queries against every prompt key, as
its reference code does, then one selection per KV head (our GQA-aware assumption).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from kvsim.compression.base import Amount, Compression, Key, WorkAdder
from kvsim.errors import ConfigError

if TYPE_CHECKING:
    from kvsim.compression.sizing import LayerBytes


class SnapKV(Compression):
    name = "snapkv"
    summary = "an observation window votes after prefill; top-k prompt tokens per head kept"
    source = "SnapKV, Li et al., arXiv 2404.14469"
    keys: ClassVar[Mapping[str, Key]] = {
        "window": Key("int", 32, "Observation window w at the end of the prompt (SnapKV: 32)."),
        "capacity": Key(
            "int",
            2048,
            "Prompt tokens kept per head, k + w (SnapKV's 'KV size'; its LongBench runs "
            "use 1024, 2048 and 4096; the reference snapkv_utils.py defaults to 2048).",
        ),
    }
    drops_tokens = True
    prompt_only = True
    budget_note = "; a window must equal the one the paper states"

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> Compression:
        params = {"window": 32, "capacity": 2048, **values}
        if params["capacity"] <= params["window"]:
            raise ConfigError(
                f"compression snapkv: capacity={params['capacity']} must exceed window="
                f"{params['window']} (capacity = top-k + window)"
            )
        return cls.build(params)

    def keep(self, tokens: int, layer: int | None) -> int:
        return self.param("capacity")

    def add_layer_work(
        self, add: WorkAdder, layer: int, lb: LayerBytes, q_heads: int, key_dims: int
    ) -> None:
        add("score_flops_per_prompt_token", q_heads * 2.0 * self.param("window") * key_dims)
        add("select_items_per_prompt_token", lb.heads)

    def quality_budget(self) -> tuple[Amount, str]:
        return self.param("capacity"), f"capacity {self.param('capacity')}"

    def quality_keys(self) -> dict[str, Any]:
        return {"window": self.param("window")}

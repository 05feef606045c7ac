"""``moe-nd``: every KV layer routed to its own (keep ratio, K bits, V bits) expert.

Sun et al., arXiv 2604.17695: per-layer eviction ratio and K/V bit widths under a global memory
budget. The experts come from a table (``table=PATH``), from our reconstruction of its greedy
solver (``budget=RATIO``, over ``sensitivity=PATH`` or a synthetic table of ``n_layers``), or
are listed (``layers=…``, the canonical form the others resolve to). A prompt-only profile:
``⌈keep_l · prompt⌉`` plus every generated token; a one-entry list applies to every layer. The
eviction scorer's cost is not published (priced at 0); layers that drop tokens select per KV
head after prefill.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from kvsim.compression.base import MAX_LAYERS, Compression, Key, LayerConfig, WorkAdder, pick
from kvsim.compression.quality import QualityPoint
from kvsim.errors import ConfigError

if TYPE_CHECKING:
    from kvsim.compression.sizing import LayerBytes

#: The compression ratio (against 16-bit KV) up to which the abstract's point applies.
MAX_RATIO = 14

POINT = QualityPoint(
    benchmark="LongBench-v1, 4-task subset, 16k inputs, n=50 per task",
    model="the paper's reasoning model (not named in the abstract)",
    retained=1.0,
    score=None,
    baseline=None,
    source="MoE-nD, arXiv 2604.17695, abstract",
    note=(
        "the abstract says the hetero variant 'matches' the uncompressed 1.9 GB baseline at 14x "
        "compression (136 MB); read as 1.0 retained; applied to every moe-nd configuration "
        "at ≤ 14× on our assumption that keeping more bytes loses no quality; it holds for the "
        "paper's calibrated routing, not for a routing solved from kvsim's synthetic table"
    ),
)


class MoEnD(Compression):
    name = "moe-nd"
    summary = "per-layer (keep ratio, K bits, V bits) from a table or the greedy solver"
    source = "MoE-nD, Sun et al., arXiv 2604.17695"
    keys: ClassVar[Mapping[str, Key]] = {
        "table": Key("path", None, "TOML or CSV file of per-layer keep, kbits, vbits."),
        "budget": Key(
            "ratio",
            None,
            "Run the greedy solver for this fraction of the 16-bit KV bytes.",
        ),
        "sensitivity": Key(
            "path",
            None,
            "Per-layer sensitivity table for the solver (TOML or CSV); default: the "
            "synthetic example table (our assumption, not the paper's).",
        ),
        "n_layers": Key(
            "int", 32, "Layers of the synthetic sensitivity table (without sensitivity=)."
        ),
        "layers": Key(
            "layers",
            None,
            "Per-layer experts KEEPxKBITSxVBITS separated by '/', '*N' repeats "
            "(the canonical form table= and budget= resolve to).",
        ),
        "group": Key(
            "int", 32, "Elements per quantisation group (fp16 scale + zero each), as quant."
        ),
    }
    drops_tokens = True
    prompt_only = True
    work_notes = ("moe-nd: the eviction scorer's cost is not published; priced at 0",)

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> Compression:
        from kvsim.compression.solver import (
            load_layer_table,
            load_sensitivity,
            solve,
            synthetic_sensitivity,
        )

        sources = [k for k in ("table", "budget", "layers") if k in values]
        if len(sources) != 1:
            raise ConfigError(
                "compression moe-nd: give exactly one of table=PATH, budget=RATIO (solver) or "
                f"layers=…; got {', '.join(sources) or 'none of them'}"
            )
        if "sensitivity" in values and "budget" not in values:
            raise ConfigError("compression moe-nd: sensitivity= is read only with budget=")
        if "n_layers" in values and ("budget" not in values or "sensitivity" in values):
            raise ConfigError(
                "compression moe-nd: n_layers= sizes the synthetic table: give it with budget= "
                "and without sensitivity="
            )
        group = values.get("group", 32)
        if "layers" in values:
            configs = values["layers"]
        elif "table" in values:
            configs = load_layer_table(values["table"])
        else:
            if "sensitivity" in values:
                table = load_sensitivity(values["sensitivity"])
            else:
                table = synthetic_sensitivity(_layer_count(values.get("n_layers", 32), "n_layers"))
            _layer_count(len(table), "sensitivity")
            configs = solve(table, values["budget"], group).configs
        _layer_count(len(configs), "table")
        return cls.build({"layers": configs, "group": group}, layer_configs=configs)

    @property
    def layer_count(self) -> int | None:
        count = len(self.layer_configs)
        return count if count > 1 else None  # one entry applies to every layer

    def layer_count_hint(self, kv_layers: int) -> str:
        """budget= solves over n_layers= synthetic layers (32 by default), whatever the model."""
        return (
            f"give {kv_layers} experts (layers= entries or table= rows) or a single one for all "
            f"layers (layers=0.5x4x2); budget= solves over a synthetic table of n_layers= layers "
            f"(32 unless given): add n_layers={kv_layers}"
        )

    def _layer_config(self, layer: int) -> LayerConfig:
        return pick(self.layer_configs, layer, self.name, "layers")

    def keep_ratio(self, layer: int | None) -> Fraction:
        ratios = tuple(c.keep for c in self.layer_configs)
        if layer is None:
            return sum(ratios, Fraction(0)) / len(ratios)
        return pick(ratios, layer, self.name, "ratio")

    def keep(self, tokens: int, layer: int | None) -> int:
        return math.ceil(self.keep_ratio(layer) * tokens)

    def layer_bits(self, layer: int | None = None) -> tuple[int, int, int] | None:
        cfg = self._layer_config(0 if layer is None else layer)
        if cfg.kbits >= 16 and cfg.vbits >= 16:
            return None
        return cfg.kbits, cfg.vbits, self.param("group")

    def add_layer_work(
        self, add: WorkAdder, layer: int, lb: LayerBytes, q_heads: int, key_dims: int
    ) -> None:
        if self.keep_ratio(layer) < 1:
            add("select_items_per_prompt_token", lb.heads)

    def compression_ratio(self) -> float:
        """Compression against 16-bit KV: 1 / the mean per-layer byte fraction."""
        from kvsim.compression.solver import option_cost

        group = self.param("group")
        costs = [option_cost(c, group) for c in self.layer_configs]
        return len(costs) / sum(costs)

    def fixed_quality_points(self) -> list[QualityPoint]:
        return [POINT] if self.compression_ratio() <= MAX_RATIO + 1e-9 else []

    def no_quality_reason(self) -> str:
        return (
            f"no published number found for {self.compression_ratio():.1f}x compression: "
            "MoE-nD's abstract (arXiv 2604.17695) reports matching the baseline at 14x, "
            "nothing beyond"
        )


def _layer_count(count: int, key: str) -> int:
    """`count` layers, refused past MAX_LAYERS (a table or solver that large is not a model's)."""
    if count > MAX_LAYERS:
        raise ConfigError(
            f"compression moe-nd: {key}= gives {count:,} layers; at most {MAX_LAYERS} are taken"
        )
    return count

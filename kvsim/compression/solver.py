"""MoE-nD's per-layer solver: each layer's (keep, K bits, V bits) under one global memory budget.

MoE-nD (arXiv 2604.17695) routes every layer to its own (eviction ratio, K bits, V bits) tuple
with "an offline-calibrated greedy solver" that minimises predicted quality loss under a global
memory budget. Only the abstract is public to us, so the greedy rule below is our
reconstruction of that sentence (issue 14 states it: marginal quality loss per byte saved):

1. every layer starts at its lowest-loss option (ties: the larger one);
2. while the total cost exceeds the budget, take the single move, over all layers and all of a
   layer's cheaper options, with the smallest loss increase per unit of cost saved (ties: lower
   layer, then the table's option order); a move that lowers loss is taken first;
3. stop at the first configuration within budget.

Cost is model-free so the profile can be solved before the model is known: one option costs
``keep × (eff(kbits) + eff(vbits)) / 32`` of the layer's 16-bit KV bytes, with
``eff(b) = b + 32 / group`` bits per element for ``b < 16`` (fp16 scale + fp16 zero per group)
and ``eff(16) = 16``. That is exact for any head dim that ``group`` divides. The budget is a
fraction of the whole model's 16-bit KV bytes: ``Σ cost ≤ budget × layers``.

Greedy is exact when each layer's options lie on a convex loss-vs-cost curve and all steps save
the same cost; with convex curves and unequal steps it is exact for the budget it stops at (a
Lagrangian point). On arbitrary tables it can miss the optimum: docs/compression.md reports the
gap measured against brute force.

No published sensitivity table exists (the paper's calibration data is not public), so
``synthetic_sensitivity`` makes a clearly synthetic one for demos: our assumption, not data.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from kvsim.compression.base import LayerConfig
from kvsim.errors import ConfigError
from kvsim.textio import parse_toml, read_utf8

__all__ = [
    "Option",
    "Solution",
    "load_layer_table",
    "load_sensitivity",
    "option_cost",
    "solve",
    "synthetic_sensitivity",
]


@dataclass(frozen=True)
class Option:
    """One candidate expert for a layer and the quality loss calibration measured for it."""

    config: LayerConfig
    loss: float


@dataclass(frozen=True)
class Solution:
    """The solver's choice: one option index and config per layer, its total cost and loss."""

    choice: tuple[int, ...]
    configs: tuple[LayerConfig, ...]
    cost: float  # in layers' worth of 16-bit KV (budget × layers is the limit)
    loss: float


def _eff_bits(bits: int, group: int) -> float:
    return 16.0 if bits >= 16 else bits + 32.0 / group


def option_cost(config: LayerConfig, group: int = 32) -> float:
    """Fraction of a layer's 16-bit KV bytes the option keeps (scales and zero-points included)."""
    return (
        float(config.keep) * (_eff_bits(config.kbits, group) + _eff_bits(config.vbits, group)) / 32
    )


def solve(
    table: tuple[tuple[Option, ...], ...], budget: Fraction | float, group: int = 32
) -> Solution:
    """Greedy choice per layer under ``budget`` (a fraction of the 16-bit KV bytes); see module."""
    if not table or any(not options for options in table):
        raise ConfigError(
            "moe-nd solver: the sensitivity table needs at least one option per layer"
        )
    limit = float(budget) * len(table)
    costs = [[option_cost(o.config, group) for o in options] for options in table]
    choice = [
        min(range(len(options)), key=lambda i, o=options, c=cst: (o[i].loss, -c[i], i))
        for options, cst in zip(table, costs, strict=True)
    ]
    total = sum(costs[layer][i] for layer, i in enumerate(choice))
    eps = 1e-12
    while total > limit + eps:
        best: tuple[float, int, int] | None = None
        for layer, options in enumerate(table):
            here = choice[layer]
            for j, option in enumerate(options):
                saved = costs[layer][here] - costs[layer][j]
                if saved <= eps:
                    continue
                rate = (option.loss - options[here].loss) / saved
                if best is None or rate < best[0] - eps:
                    best = (rate, layer, j)
        if best is None:
            cheapest = sum(min(c) for c in costs) / len(table)
            raise ConfigError(
                f"moe-nd: budget={float(budget):g} is below the cheapest configuration the table "
                f"allows ({cheapest:.4f} of the 16-bit KV bytes)"
            )
        _, layer, j = best
        total += costs[layer][j] - costs[layer][choice[layer]]
        choice[layer] = j
    configs = tuple(table[layer][i].config for layer, i in enumerate(choice))
    loss = sum(table[layer][i].loss for layer, i in enumerate(choice))
    return Solution(tuple(choice), configs, total, loss)


# -- tables ----------------------------------------------------------------------------------------
def _rows(path: str) -> list[dict[str, Any]]:
    """Rows of a TOML (``[[layer]]`` / ``[[option]]`` tables) or CSV file, as dicts."""
    shown = path
    text = read_utf8(Path(path), shown, ConfigError)
    if path.lower().endswith(".toml"):
        data = parse_toml(text, shown, ConfigError)
        rows = data.get("layer", data.get("option"))
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ConfigError(f"{shown}: expected [[layer]] (or [[option]]) tables")
        return rows
    if path.lower().endswith(".csv"):
        return list(csv.DictReader(io.StringIO(text)))
    raise ConfigError(f"{shown}: expected a .toml or .csv file")


def _field(row: dict[str, Any], key: str, shown: str, line: int) -> Any:
    if key not in row or row[key] in (None, ""):
        raise ConfigError(f"{shown}: row {line}: missing {key!r}")
    return row[key]


def _config(row: dict[str, Any], shown: str, line: int) -> LayerConfig:
    try:
        keep = Fraction(str(_field(row, "keep", shown, line)))
        kbits = int(_field(row, "kbits", shown, line))
        vbits = int(_field(row, "vbits", shown, line))
    except (ValueError, TypeError):
        raise ConfigError(f"{shown}: row {line}: keep, kbits, vbits must be numbers") from None
    if not 0 < keep <= 1:
        raise ConfigError(f"{shown}: row {line}: keep={float(keep)}: expected a ratio in (0, 1]")
    rest = keep.denominator
    for prime in (2, 5):
        while rest % prime == 0:
            rest //= prime
    if rest != 1 or keep.denominator > 10**24:
        raise ConfigError(f"{shown}: row {line}: keep must be a decimal such as 0.25")
    for name, bits in (("kbits", kbits), ("vbits", vbits)):
        if not 1 <= bits <= 16:
            raise ConfigError(f"{shown}: row {line}: {name}={bits}: expected 1-16")
    return LayerConfig(keep, kbits, vbits)


def _layer_index(row: dict[str, Any], shown: str, line: int) -> int:
    try:
        return int(_field(row, "layer", shown, line))
    except (ValueError, TypeError):
        raise ConfigError(f"{shown}: row {line}: layer must be an integer") from None


def load_layer_table(path: str) -> tuple[LayerConfig, ...]:
    """Per-layer experts from a file: one row per layer 0..L-1 with keep, kbits, vbits."""
    rows = _rows(path)
    by_layer: dict[int, LayerConfig] = {}
    for line, row in enumerate(rows, 1):
        layer = _layer_index(row, path, line)
        if layer in by_layer:
            raise ConfigError(f"{path}: row {line}: layer {layer} given twice")
        by_layer[layer] = _config(row, path, line)
    if sorted(by_layer) != list(range(len(by_layer))) or not by_layer:
        raise ConfigError(f"{path}: layers must be numbered 0..L-1 with none missing")
    return tuple(by_layer[i] for i in range(len(by_layer)))


def load_sensitivity(path: str) -> tuple[tuple[Option, ...], ...]:
    """Sensitivity rows (layer, keep, kbits, vbits, loss) grouped per layer 0..L-1."""
    rows = _rows(path)
    by_layer: dict[int, list[Option]] = {}
    for line, row in enumerate(rows, 1):
        layer = _layer_index(row, path, line)
        try:
            loss = float(_field(row, "loss", path, line))
        except (ValueError, TypeError):
            raise ConfigError(f"{path}: row {line}: loss must be a number") from None
        if not math.isfinite(loss):
            raise ConfigError(f"{path}: row {line}: loss must be finite")
        by_layer.setdefault(layer, []).append(Option(_config(row, path, line), loss))
    if sorted(by_layer) != list(range(len(by_layer))) or not by_layer:
        raise ConfigError(f"{path}: layers must be numbered 0..L-1 with none missing")
    return tuple(tuple(by_layer[i]) for i in range(len(by_layer)))


#: Options of the synthetic table: keep ratios × (K bits, V bits) pairs.
SYNTHETIC_KEEPS = (Fraction(1), Fraction(1, 2), Fraction(1, 4), Fraction(1, 8))
SYNTHETIC_BITS = ((16, 16), (8, 8), (4, 4), (4, 2), (2, 2))


def synthetic_sensitivity(layers: int = 32) -> tuple[tuple[Option, ...], ...]:
    """A SYNTHETIC sensitivity table for demos (our assumption; no published table exists).

    Loss of (keep, kb, vb) at layer l: ``s_l × ((1 − keep)² + q(kb) + 0.5 × q(vb))`` with
    ``q(b) = 4^-(b/2)`` (quantisation error shrinking ×2 per bit, squared), zero at 16 bits, and
    layer sensitivity ``s_l`` higher at the first and last layers (a U shape). Keys weigh twice
    values because KIVI reports keys harder to quantise; every other number here is made up.
    """
    if layers < 1:
        raise ConfigError(f"moe-nd: n_layers={layers}: expected an integer ≥ 1")

    def q(bits: int) -> float:
        return 0.0 if bits >= 16 else 4.0 ** (-bits / 2)

    table = []
    for layer in range(layers):
        x = layer / max(1, layers - 1)
        s = 0.5 + 2.0 * (2 * x - 1) ** 2
        table.append(
            tuple(
                Option(
                    LayerConfig(keep, kb, vb), s * ((1 - float(keep)) ** 2 + q(kb) + 0.5 * q(vb))
                )
                for keep, (kb, vb) in itertools.product(SYNTHETIC_KEEPS, SYNTHETIC_BITS)
            )
        )
    return tuple(table)

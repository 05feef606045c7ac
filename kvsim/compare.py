"""Side-by-side runs: one row per configuration, each figure with its ratio to a baseline.

Users decide from a table, not from one run (issue 13). `compare` expands the varied settings
into a grid over a base config, runs every point (and the baseline, when it is not one of them)
on the sweep executors, and returns a `Comparison`:

    from kvsim.compare import compare
    from kvsim.run import RunConfig
    table = compare(RunConfig(trace="agentic"), {"policy": ["lru", "bayes-reuse"]},
                    baseline={"policy": "lru"}, jobs=1)
    table.rows[1].ratios["ttft_p99_s"], table.to_markdown(), table.to_json()

Keys are the sweep spec's flat keys (`kvsim.sweep.spec.KEY_TYPES`: ``policy``, ``tiers``,
``router``, ``replicas``, ``hardware``, ``prefetch``, ``compression``, ...). Memory (mean KV
per request, peak KV in HBM) and the quality proxy (published accuracy retained; "unpublished"
where no number exists) stand beside latency and throughput. A ratio is the row's figure divided
by the baseline's, None when either is missing or the baseline's is zero.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.errors import ConfigError
from kvsim.run import RunConfig
from kvsim.sweep import Executor, run_many
from kvsim.sweep.spec import (
    KEY_TYPES,
    check_grid_size,
    describe,
    flat_config,
    params_of,
    resolve,
)

#: The figures of a row: summary key -> (column label, unit scale for the terminal).
FIGURES: dict[str, tuple[str, float]] = {
    "ttft_p50_s": ("TTFT p50 ms", 1000.0),
    "ttft_p99_s": ("TTFT p99 ms", 1000.0),
    "tpot_p50_s": ("TPOT p50 ms", 1000.0),
    "tpot_p99_s": ("TPOT p99 ms", 1000.0),
    "throughput_tokens_per_s": ("output tok/s", 1.0),
    "goodput_tokens_per_s": ("goodput tok/s", 1.0),
    "prefix_hit_ratio": ("hit ratio", 1.0),
    "cost_per_million_tokens_usd": ("$/M tok", 1.0),
    # KV compression (issue 14): memory and quality beside latency and throughput
    "kv_bytes_per_request_mean": ("KV MiB/req", 1.0 / 2**20),
    "peak_hbm_kv_bytes": ("peak KV GiB", 1.0 / 2**30),
    "quality_retained": ("quality", 1.0),
}
_HIT = "hit_ratio."  # prefix of the per-tier hit ratio figures


def figures(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """A run summary's compared figures: `FIGURES`, then ``hit_ratio.<tier>`` per tier."""
    out: dict[str, float | None] = {key: _number(summary.get(key)) for key in FIGURES}
    quality = summary.get("quality")
    out["quality_retained"] = (
        _number(quality.get("retained")) if isinstance(quality, Mapping) else None
    )
    for tier, ratio in summary.get("hit_ratio_by_tier", {}).items():
        out[_HIT + tier] = _number(ratio)
    return out


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base; None when either is missing or the base is zero."""
    if value is None or base is None or base == 0:
        return None
    return value / base


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Row:
    """One configuration: the varied settings that name it, its figures, their ratios."""

    params: dict[str, Any]
    figures: dict[str, float | None]
    ratios: dict[str, float | None]
    baseline: bool
    config: RunConfig


@dataclass(frozen=True)
class Comparison:
    """The table `compare` returns; ``rows`` in grid order (the baseline last if run apart)."""

    rows: list[Row]
    baseline: dict[str, Any]
    keys: list[str]  # the figure keys, in column order

    def as_records(self) -> list[dict[str, Any]]:
        """One flat dict per row: params, figures, ``<figure>_ratio``, ``baseline``."""
        out = []
        for row in self.rows:
            rec: dict[str, Any] = dict(row.params)
            for key in self.keys:
                rec[key] = row.figures.get(key)
                rec[f"{key}_ratio"] = row.ratios.get(key)
            rec["baseline"] = row.baseline
            out.append(rec)
        return out

    def to_frame(self) -> Any:
        """The records as a pandas DataFrame (for notebooks)."""
        import pandas as pd

        return pd.DataFrame(self.as_records())

    def to_json(self) -> str:
        """Strict JSON: {"baseline": settings, "rows": records}; missing figures are null."""
        return json.dumps(
            {"baseline": self.baseline, "rows": self.as_records()}, allow_nan=False, indent=2
        )

    def to_markdown(self) -> str:
        """A Markdown table: each figure as 'value (ratio×)'."""
        return self._render(markdown=True)

    def format(self) -> str:
        """The terminal table (the same cells as the Markdown one, aligned)."""
        return self._render(markdown=False)

    def _render(self, markdown: bool) -> str:
        params = list(self.rows[0].params) if self.rows else []
        head = [*params, *(_label(k) for k in self.keys)]
        body = []
        for row in self.rows:
            cells = [_param(row.params[p]) for p in params]
            if row.baseline and params:
                cells[0] += " (baseline)"
            for key in self.keys:
                cells.append(_cell(key, row.figures.get(key), row.ratios.get(key)))
            body.append(cells)
        if markdown:
            lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(cells) + " |" for cells in body]
            return "\n".join(lines)
        widths = [max(len(c) for c in col) for col in zip(head, *body, strict=True)]
        return "\n".join(
            "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip()
            for cells in [head, *body]
        )


def _label(key: str) -> str:
    if key.startswith(_HIT):
        return f"hit {key[len(_HIT) :]}"
    return FIGURES[key][0]


def _param(value: object) -> str:
    return "(default)" if value is None else str(value)


def _cell(key: str, value: float | None, rel: float | None) -> str:
    if value is None:
        return "unpublished" if key == "quality_retained" else "-"
    scale = 1.0 if key.startswith(_HIT) else FIGURES[key][1]
    scaled = value * scale
    if key.startswith(_HIT) or key in ("prefix_hit_ratio", "quality_retained"):
        text = f"{scaled:.3f}"
    elif key == "cost_per_million_tokens_usd":
        text = f"{scaled:.4f}"
    else:
        text = f"{scaled:,.1f}" if scaled < 100 else f"{scaled:,.0f}"
    return text + (f" ({rel:.2f}x)" if rel is not None else "")


def _typed(key: str, value: object) -> Any:
    """A varied value in its key's type: CLI strings are converted ('2' -> 2 for replicas)."""
    if key not in KEY_TYPES:
        raise ConfigError(f"vary {key}: unknown key; valid: {', '.join(KEY_TYPES)}")
    kind = KEY_TYPES[key]
    if not isinstance(value, str) or kind is str:
        return value
    try:
        if kind is bool:
            if value.lower() not in ("true", "false"):
                raise ValueError
            return value.lower() == "true"
        return kind(value)
    except ValueError:
        raise ConfigError(f"vary {key}: expected {kind.__name__} values, got {value!r}") from None


def _apply(base: RunConfig, settings: Mapping[str, Any]) -> RunConfig:
    values = flat_config(base)
    values.update({k: _typed(k, v) for k, v in settings.items()})
    return resolve(values)


def compare(
    base: RunConfig,
    vary: Mapping[str, Sequence[Any]],
    baseline: Mapping[str, Any] | None = None,
    *,
    executor: str | Executor = "local",
    jobs: int | None = None,
    progress: bool = False,
) -> Comparison:
    """Run the grid of `vary` over `base` and return every point with its ratios to the baseline.

    `baseline` is settings applied to `base` (default: the grid's first point). When it equals
    a grid point that row is the baseline; otherwise it runs too, as a last row. A baseline key
    that is not varied is a column too, so each row shows its value. A value given twice (in its
    key's type: '1' and '1.0' for a float) raises ConfigError: a repeated row says nothing. A
    failed run, or one in which no request completed, raises ConfigError with its
    one-line error.
    """
    if not vary:
        raise ConfigError("vary: give at least one key with a list of values")
    keys = list(vary)
    for key, values in vary.items():
        if isinstance(values, str) or not values:
            raise ConfigError(f"vary {key}: expected a non-empty list of values")
    check_grid_size(
        [(key, len(values)) for key, values in vary.items()], "vary", "vary fewer keys at once"
    )
    for key, values in vary.items():
        typed = [_typed(key, v) for v in values]
        for i, value in enumerate(typed):
            if value in typed[:i]:
                raise ConfigError(f"vary {key}: {values[i]!r} given twice")
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*vary.values())]
    configs = [_apply(base, p) for p in points]
    base_settings = dict(baseline) if baseline else dict(points[0])
    base_config = _apply(base, base_settings)
    # a baseline set on a key not varied gets its own column, so every row says what it ran
    columns_of_params = keys + [k for k in base_settings if k not in keys]
    params: list[dict[str, Any]] = [params_of(c, columns_of_params) for c in configs]
    for row, point in zip(params, points, strict=True):
        row.update({k: point[k] for k in keys})  # the varied values as the user wrote them
    index = next((i for i, c in enumerate(configs) if c == base_config), None)
    if index is None:
        configs.append(base_config)
        params.append(params_of(base_config, columns_of_params))
        index = len(configs) - 1
    results = run_many(configs, executor=executor, jobs=jobs, params=params, progress=progress)
    for r in results:
        if not r.ok:
            raise ConfigError(f"compare: {describe(r.params)}: {r.error}")
    table = [figures(r.summary or {}) for r in results]
    columns = list(FIGURES)
    for figs in table:
        columns += [k for k in figs if k not in columns]
    ref = table[index]
    rows = [
        Row(
            params=p,
            figures={k: f.get(k) for k in columns},
            ratios={k: ratio(f.get(k), ref.get(k)) for k in columns},
            baseline=i == index,
            config=r.config,
        )
        for i, (p, f, r) in enumerate(zip(params, table, results, strict=True))
    ]
    return Comparison(rows, base_settings, columns)

"""A sweep spec (TOML) expanded into configurations, each checked before anything runs.

    [base]                  # any config key, flat or in the config file's tables
    trace = "mooncake-conversation"
    max_requests = 2000
    [base.engine]
    tiers = "hbm,dram"
    [grid]                  # every combination
    policy = ["lru", "s3fifo"]
    replicas = [1, 2]
    [grid.tier_capacity]    # one tier's per-node size: merged into tier_capacity
    dram = ["256GiB", "1TiB"]
    [zip]                   # equal-length lists, taken together
    rate_scale = [1.0, 2.0]
    seed = [0, 1]
    [[configs]]             # an explicit list of override tables (or [[list]])
    router = "round-robin"

Keys are `kvsim run`'s: RunConfig's fields (``trace``, ``max_requests``, ``rate_scale``,
``model``, ``weight_dtype``, ``hardware``, ``slo_ttft_s``, …) and EngineConfig's (``policy``,
``replicas``, ``router``, ``pd``, ``tp``, ``tier_capacity``, ``seed``, …), flat or under the
config file's tables (``engine.policy``, ``trace.name``, ``model.name``, ``hardware.profile``,
``slo.ttft_s``), plus ``tier_capacity.<tier>`` for one tier's size. The configurations are the
product of the sections given (grid × zip × list); a key may appear in one section only, and a
section's value overrides ``[base]``. Without any section the sweep is the base alone.

A configuration's id is a hash of its whole resolved config, so the same configuration gets
the same folder in every sweep (that is what resume keys on), and changing ``[base]`` changes
every id rather than reusing results that no longer match.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.config import RunConfig
from kvsim.engine.config import EngineConfig
from kvsim.engine.resolve import pd_split
from kvsim.errors import ConfigError, KvsimError
from kvsim.hardware.tier_kinds import TIER_NAMES
from kvsim.resolve import resolve as resolve_run
from kvsim.textio import read_utf8
from kvsim.units import parse_size

SECTIONS = ("base", "grid", "zip", "list", "configs")
#: The most configurations one sweep or comparison expands to: each is a run (seconds to hours),
#: and each is resolved before the first starts (about 8 ms apiece), so 10,000 already means
#: hours. Checked from the lists' lengths, before the product is built.
MAX_CONFIGURATIONS = 10_000
_KINDS = {"int": int, "float": float, "str": str, "bool": bool}
#: The engine's weight dtype is the run's choice (RunConfig.weight_dtype), as in `kvsim run`.
_ENGINE_KEYS = {f.name: f for f in dataclasses.fields(EngineConfig) if f.name != "weight_dtype"}
_RUN_KEYS = {f.name: f for f in dataclasses.fields(RunConfig) if f.name != "engine"}
#: Flat key -> expected Python type (the first type of the field's annotation).
KEY_TYPES: dict[str, type] = {
    name: _KINDS[str(f.type).split("|")[0].strip()]
    for name, f in (*_RUN_KEYS.items(), *_ENGINE_KEYS.items())
}
#: The config file's table.key names, as `RunConfig.from_toml` reads them -> flat keys.
TABLE_KEYS: dict[str, str] = {
    "trace.name": "trace",
    "trace.format": "trace_format",
    "model.name": "model",
    "model.weight_dtype": "weight_dtype",
    "hardware.profile": "hardware",
    "slo.ttft_s": "slo_ttft_s",
    "slo.tpot_s": "slo_tpot_s",
    **{f"trace.{k}": k for k in ("max_requests", "rate", "rate_scale", "arrival", "cv")},
    **{f"trace.{k}": k for k in ("tokenizer", "skip_bad_rows")},
    **{f"engine.{k}": k for k in _ENGINE_KEYS},
}
_TABLES = ("trace", "model", "hardware", "engine", "slo", "tier_capacity")
_TIER_PREFIX = "tier_capacity."


@dataclass(frozen=True)
class Configuration:
    """One point of a sweep: its resolved config, id, and the parameters that name it."""

    id: str
    config: RunConfig
    params: dict[str, Any]  # the swept keys -> this configuration's values


def config_id(config: RunConfig) -> str:
    """12 hex digits of SHA-256 over the resolved config: equal configs, equal ids."""
    text = json.dumps(config.as_dict(), sort_keys=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def flat_config(config: RunConfig) -> dict[str, Any]:
    """A config as flat keys (the spec's names): RunConfig's fields, then EngineConfig's."""
    out = {name: getattr(config, name) for name in _RUN_KEYS}
    out.update({name: getattr(config.engine, name) for name in _ENGINE_KEYS})
    if out.get("replicas", 0) is None:  # not given: the count the run has (1, or P + D)
        split = pd_split(config.engine)
        out["replicas"] = sum(split) if split else 1
    return out


def varying_params(configs: Sequence[RunConfig]) -> list[dict[str, Any]]:
    """For each config, the flat keys whose values differ among `configs` (their parameters)."""
    flats = [flat_config(c) for c in configs]
    keys = [k for k in (flats[0] if flats else {}) if len({repr(f[k]) for f in flats}) > 1]
    return [{k: f[k] for k in keys} for f in flats]


def load_spec(path: str | os.PathLike[str]) -> list[Configuration]:
    """Read, expand and check a spec file: every configuration passes `check_configuration`
    before this returns, so a bad spec runs nothing. Raises ConfigError naming file and key."""
    where = str(path)
    text = read_utf8(Path(path), where, ConfigError)
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        raise ConfigError(f"{where}: invalid TOML: {' '.join(str(exc).split())}") from None
    return expand_spec(doc, where)


def expand_spec(doc: Mapping[str, Any], where: str = "spec") -> list[Configuration]:
    """`load_spec` for a parsed document (`where` names it in errors)."""
    for name in doc:
        if name not in SECTIONS:
            raise ConfigError(
                f"{where}: unknown section [{_printable(name)}]; expected {', '.join(SECTIONS)}"
            )
    if "list" in doc and "configs" in doc:
        raise ConfigError(f"{where}: give [[list]] or [[configs]], not both")
    base = _values(_table(doc.get("base", {}), "base", where), "base", where)
    axes: list[list[dict[str, Any]]] = []
    owner: dict[str, str] = {}
    sizes: list[tuple[str, int]] = []  # each section's length, checked before any product
    if "grid" in doc:
        grid = _lists(_table(doc["grid"], "grid", where), "grid", where)
        keys = list(grid)
        sizes += [(f"grid.{k}", len(v)) for k, v in grid.items()]
        check_grid_size(sizes, where)
        axes.append(
            [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]
        )
        owner.update(dict.fromkeys(keys, "grid"))
    if "zip" in doc:
        zipped = _lists(_table(doc["zip"], "zip", where), "zip", where)
        lengths = {k: len(v) for k, v in zipped.items()}
        first = next(iter(lengths))
        for key, n in lengths.items():
            if n != lengths[first]:
                raise ConfigError(
                    f"{where}: zip.{key}: {n} values, but zip.{first} has {lengths[first]}; "
                    "zipped lists must have equal lengths"
                )
        _claim(owner, zipped, "zip", where)
        sizes.append(("zip", lengths[first]))
        check_grid_size(sizes, where)
        axes.append(
            [dict(zip(zipped, row, strict=True)) for row in zip(*zipped.values(), strict=True)]
        )
    for name in ("list", "configs"):
        if name in doc:
            items = doc[name]
            if not isinstance(items, list) or not items:
                raise ConfigError(
                    f"{where}: {name}: expected [[{name}]] tables (a non-empty array of "
                    f"override tables), got {items!r:.60}"
                )
            rows = []
            for i, item in enumerate(items):
                label = f"{name}[{i}]"
                rows.append(_values(_table(item, label, where), label, where))
            _claim(owner, {k: None for row in rows for k in row}, name, where)
            sizes.append((name, len(rows)))
            check_grid_size(sizes, where)
            axes.append(rows)
    keys = list(owner)
    overrides = [
        {k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes)
    ]
    out: list[Configuration] = []
    seen: dict[str, int] = {}
    for i, override in enumerate(overrides):
        label = f"{where}: configuration {i + 1} of {len(overrides)}"
        if override:
            label += f" ({describe(override)})"
        try:
            config = resolve({**base, **override})
            check_configuration(config)
        except KvsimError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        cid = config_id(config)
        if cid in seen:
            raise ConfigError(f"{label}: the same configuration as number {seen[cid] + 1}")
        seen[cid] = i
        out.append(Configuration(cid, config, params_of(config, keys)))
    return out


def check_grid_size(
    sizes: Sequence[tuple[str, int]], where: str, hint: str = "list the points you need in [[list]]"
) -> int:
    """The number of configurations `sizes` (label, values) multiply to; ConfigError naming
    every size when it exceeds MAX_CONFIGURATIONS. Arithmetic only: nothing is expanded."""
    total = math.prod(n for _, n in sizes)
    if total > MAX_CONFIGURATIONS:
        product = " × ".join(f"{label} {n:,}" for label, n in sizes)
        raise ConfigError(
            f"{where}: {product} = {_count(total)} configurations; at most "
            f"{MAX_CONFIGURATIONS:,} in one run of kvsim (each is a simulation): split it, or "
            f"{hint}"
        )
    return total


def _count(n: int) -> str:
    """'12,000' or, past a trillion, '1e+20': a count that fits on a line."""
    return f"{n:,}" if n < 10**12 else f"{n:.3g}"


def resolve(values: Mapping[str, Any]) -> RunConfig:
    """A RunConfig from flat keys (``tier_capacity.<tier>`` merged into ``tier_capacity``)."""
    values = dict(values)
    tiers = {
        k[len(_TIER_PREFIX) :]: values.pop(k) for k in list(values) if k.startswith(_TIER_PREFIX)
    }
    if tiers:
        merged = _tier_sizes(values.get("tier_capacity", ""))
        merged.update(tiers)
        values["tier_capacity"] = ",".join(f"{t}={size}" for t, size in merged.items())
    engine = EngineConfig(**{k: v for k, v in values.items() if k in _ENGINE_KEYS})
    return RunConfig(engine=engine, **{k: v for k, v in values.items() if k in _RUN_KEYS})


def params_of(config: RunConfig, keys: Iterable[str]) -> dict[str, Any]:
    """The values of `keys` in a resolved config (a tier's size from its tier_capacity)."""
    flat = flat_config(config)
    tiers = _tier_sizes(config.engine.tier_capacity)
    return {
        k: tiers.get(k[len(_TIER_PREFIX) :]) if k.startswith(_TIER_PREFIX) else flat[k]
        for k in keys
    }


def check_configuration(config: RunConfig) -> None:
    """`kvsim.resolve.resolve` with the result dropped: every name the run will look up and every
    setting, so a typo fails the whole sweep up front instead of one run at a time."""
    resolve_run(config)


def describe(values: Mapping[str, Any]) -> str:
    """'policy=lru, replicas=2': a configuration's parameters on one line."""
    return ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in values.items())


# -- reading the sections --------------------------------------------------------------------------
def _printable(key: str) -> str:
    return key if key.isprintable() else repr(key)


def _table(got: object, name: str, where: str) -> dict[str, Any]:
    if not isinstance(got, dict):
        raise ConfigError(f"{where}: {name}: expected a table of keys, got {got!r:.60}")
    return got


def _flatten(table: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    """Flat keys from a section: the config file's tables become their flat names."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            if key not in _TABLES:
                raise ConfigError(
                    f"{where}: {name}.{_printable(key)}: unknown table; expected a key, or one "
                    f"of the tables {', '.join(_TABLES)}"
                )
            for sub, item in value.items():
                out[_flat_key(f"{key}.{sub}", name, where)] = item
        else:
            out[_flat_key(key, name, where)] = value
    return out


def _flat_key(key: str, name: str, where: str) -> str:
    if key in KEY_TYPES:
        return key
    if key in TABLE_KEYS:
        return TABLE_KEYS[key]
    if key.startswith(_TIER_PREFIX) and key[len(_TIER_PREFIX) :] in TIER_NAMES:
        return key
    raise ConfigError(
        f"{where}: {name}.{_printable(key)}: unknown key; valid: {', '.join(KEY_TYPES)}, "
        f"tier_capacity.<{'|'.join(TIER_NAMES)}>"
    )


def _values(table: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    return {k: _typed(k, v, f"{name}.{k}", where) for k, v in _flatten(table, name, where).items()}


def _lists(table: Mapping[str, Any], name: str, where: str) -> dict[str, list[Any]]:
    flat = _flatten(table, name, where)
    if not flat:
        raise ConfigError(
            f"{where}: [{name}] is empty; give at least one key with a list of values"
        )
    out = {}
    for key, got in flat.items():
        if not isinstance(got, list) or not got:
            raise ConfigError(
                f"{where}: {name}.{key}: expected a non-empty list of values, got {got!r:.60}"
            )
        out[key] = [_typed(key, v, f"{name}.{key}", where) for v in got]
    return out


def _typed(key: str, got: object, label: str, where: str) -> Any:
    """`got` checked against the key's type (an int is a float too); a tier size is parsed."""
    if key.startswith(_TIER_PREFIX):
        if not isinstance(got, str):
            raise ConfigError(f"{where}: {label}: expected a size such as '1TiB', got {got!r:.60}")
        parse_size(got, f"{where}: {label}", unit_required=True)
        return got
    kind = KEY_TYPES[key]
    ok = {
        bool: type(got) is bool,
        int: type(got) is int and -(2**63) <= got < 2**63,  # type: ignore[operator]
        float: type(got) in (int, float) and -1e300 < got < 1e300,  # type: ignore[operator]
        str: isinstance(got, str) and "\x00" not in got,
    }[kind]
    if not ok:
        expected = {bool: "true or false", int: "an integer", float: "a finite number"}
        raise ConfigError(
            f"{where}: {label}: expected {expected.get(kind, 'a string')}, got {got!r:.60}"
        )
    return float(got) if kind is float else got  # type: ignore[arg-type]


def _claim(owner: dict[str, str], keys: Iterable[str], section: str, where: str) -> None:
    """Each key in one section only: two sections setting it would silently fight."""
    for key in keys:
        if key in owner and owner[key] != section:
            raise ConfigError(
                f"{where}: {section}.{key}: already swept in [{owner[key]}]; a key may appear "
                "in one section only"
            )
        owner.setdefault(key, section)


def _tier_sizes(text: str) -> dict[str, str]:
    """'dram=1TiB,nvme=8TB' -> {'dram': '1TiB', 'nvme': '8TB'} (resolve_settings checks it)."""
    out = {}
    for part in text.split(","):
        tier, sep, size = part.partition("=")
        if sep:
            out[tier.strip()] = size.strip()
    return out

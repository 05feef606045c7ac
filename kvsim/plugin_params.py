"""Parameters of pluggable kinds (policies, routers) as typed on a command line or in a config.

One parser and one checker for every kind, so `--policy-param` and `--router-param` accept the
same syntax and refuse the same mistakes: a value of the wrong type, NaN, an unknown key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from kvsim.errors import ConfigError
from kvsim.textio import parse_json


def build_params(cls: Any, kind: str, name: str, params: Mapping[str, Any]) -> Any:
    """`cls.Params` from raw values, each checked against its field's type (`checked`)."""
    if cls.Params is None:
        raise ConfigError(f"{kind} {name!r} takes no parameters, got {', '.join(sorted(params))}")
    known = {f.name for f in fields(cls.Params)}
    try:
        hints = get_type_hints(cls.Params)
    except Exception:  # a plugin's annotation we cannot resolve: its values go in unchecked
        hints = {}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(
            f"{kind} {name!r}: unknown parameter {unknown[0]!r}; valid: {', '.join(sorted(known))}"
        )
    values = {key: checked(kind, name, key, hints.get(key), value) for key, value in params.items()}
    try:
        return cls.Params(**values)
    except ConfigError as exc:  # a Params dataclass's own range check
        raise ConfigError(f"{kind} {name!r}: {exc}") from None


def checked(kind: str, plugin: str, key: str, hint: Any, value: Any) -> Any:
    """`value` for the Params field `key` annotated `hint`: right type, finite, or ConfigError.

    Numbers, booleans and strings are checked against the field's type; tuples and lists
    element by element. An int is accepted where a float is expected; a float where an int is
    expected only when it is whole (2.0). NaN and infinities are refused everywhere: no
    parameter means anything at NaN, and JSON reads 'NaN' and 'Infinity' as numbers.
    """
    where = f"{kind} {plugin!r}: parameter {key}"

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{where}: expected {expected}, got {value!r}")

    def check(v: Any, t: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        if t is bool:
            if not isinstance(v, bool):
                raise fail("true or false")
            return v
        if t is int:
            if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v):
                raise fail("an integer")
            return int(v)
        if t is float:
            if isinstance(v, str) and v.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
                raise fail("a finite number")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise fail("a number")
            if isinstance(v, int) and not -1e300 < v < 1e300:  # float() would overflow
                raise fail("a finite number")
            return float(v)
        if t is str:
            if not isinstance(v, str):
                raise fail("text")
            return v
        origin, args = get_origin(t), get_args(t)
        if origin is tuple:
            if not isinstance(v, list | tuple):
                raise fail(f"a list of {len(args)} values")
            if args and args[-1] is not Ellipsis:
                if len(v) != len(args):
                    raise fail(f"a list of {len(args)} values")
                return tuple(check(x, a) for x, a in zip(v, args, strict=True))
            return tuple(check(x, args[0]) if args else x for x in v)
        if origin is list:
            if not isinstance(v, list | tuple):
                raise fail("a list")
            return [check(x, args[0]) if args else x for x in v]
        if origin is dict:
            if not isinstance(v, dict):
                raise fail("a table of NAME: VALUE")
            return {k: check(x, args[1]) if args else x for k, x in v.items()}
        if origin in (Union, UnionType):
            if v is None and type(None) in args:
                return None
            for option in args:
                if option is type(None):
                    continue
                try:
                    return check(v, option)
                except ConfigError:
                    continue
            raise fail(" or ".join(getattr(a, "__name__", str(a)) for a in args))
        _refuse_non_finite(v, where, value)
        return v  # an annotation we do not check (Any, a class): as given

    return check(value, hint)


def _refuse_non_finite(v: Any, where: str, shown: Any) -> None:
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"{where}: expected a finite number, got {shown!r}")
    if isinstance(v, list | tuple):
        for x in v:
            _refuse_non_finite(x, where, shown)
    if isinstance(v, dict):
        for x in v.values():
            _refuse_non_finite(x, where, shown)


def parse_params(items: str | Sequence[str], kind: str) -> dict[str, dict[str, Any]]:
    """'bayes-reuse.horizon_s=60,p.edges=[1,2]' -> parameters per plugin name.

    Items are split on commas outside brackets and JSON strings. Values are read as JSON where
    they parse (numbers, true/false, quoted strings, lists), else kept as text, so
    `--policy-param bayes-reuse.prefix_aware=false` works as typed; `checked` then refuses
    NaN and infinities."""
    if isinstance(items, str):
        items = [p for p in _split_top_level(items) if p.strip()]
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        plugin, dot, field = key.strip().rpartition(".")
        if not sep or not dot or not plugin or not field:
            raise ConfigError(f"{kind} parameter {item!r}: expected {kind.upper()}.NAME=VALUE")
        try:  # nested too deep or more than 4300 digits: a ValueError, kept as text
            value: Any = parse_json(text)
        except ValueError:
            value = text.strip()
        out.setdefault(plugin, {})[field] = value
    return out


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and JSON strings: 'p.edges=[1,2,3],p.k=2' is two items."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'" and (depth or text[i - 1 : i] == "="):  # a JSON string, not "it's"
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts

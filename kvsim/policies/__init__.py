"""Eviction policies by name: built-ins, the `kvsim.policies` entry points, and `module:Class`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import fields
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from kvsim.errors import ConfigError, KvsimError, PluginError
from kvsim.plugins import Registry
from kvsim.policies.arc import ARC
from kvsim.policies.asym_cost import AsymCost
from kvsim.policies.base import BlockInfo, EvictionPolicy
from kvsim.policies.bayes_reuse import BayesReuse
from kvsim.policies.belady import Belady
from kvsim.policies.ema_head import EmaHead
from kvsim.policies.fifo import FIFO
from kvsim.policies.gdsf import GDSF
from kvsim.policies.lfu import LFU
from kvsim.policies.lmcache_cost import LMCacheCost
from kvsim.policies.lru import LRU
from kvsim.policies.lru_k import LRUK
from kvsim.policies.mooncake_length import MooncakeLength
from kvsim.policies.radix_lru import RadixLRU
from kvsim.policies.s3fifo import S3FIFO
from kvsim.policies.sglang import SGLang
from kvsim.policies.sieve import Sieve
from kvsim.policies.srf import SRF
from kvsim.policies.twoq import TwoQ
from kvsim.policies.vllm import VLLM

__all__ = [
    "BlockInfo",
    "EvictionPolicy",
    "GuardedPolicy",
    "make_policy",
    "policy_names",
    "register",
    "resolve_policy",
]

_REGISTRY: Registry[EvictionPolicy] = Registry("policy", EvictionPolicy, "kvsim.policies")
register = _REGISTRY.register


for _cls in (
    LRU,
    FIFO,
    LFU,
    ARC,
    S3FIFO,
    Sieve,
    TwoQ,
    LRUK,
    GDSF,
    VLLM,
    RadixLRU,
    SGLang,
    LMCacheCost,
    MooncakeLength,
    SRF,
    BayesReuse,
    EmaHead,
    AsymCost,
    Belady,
):
    register(_cls)


def builtin_policy_names() -> list[str]:
    """The policies that ship with kvsim."""
    return _REGISTRY.builtin_names()


def policy_names() -> list[str]:
    """Every name ``make_policy`` accepts (built-ins and installed plugins)."""
    return _REGISTRY.names()


def resolve_policy(name: str) -> type[EvictionPolicy]:
    """The policy class for a registered name, an entry point or a ``module:Class`` path."""
    return _REGISTRY.resolve(name)


def _build_params(cls: type[EvictionPolicy], name: str, params: Mapping[str, Any]) -> Any:
    if cls.Params is None:
        raise ConfigError(f"policy {name!r} takes no parameters, got {', '.join(sorted(params))}")
    known = {f.name for f in fields(cls.Params)}
    try:
        hints = get_type_hints(cls.Params)
    except Exception:  # a plugin's annotation we cannot resolve: its values go in unchecked
        hints = {}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(
            f"policy {name!r}: unknown parameter {unknown[0]!r}; valid: {', '.join(sorted(known))}"
        )
    values = {key: _checked(name, key, hints.get(key), value) for key, value in params.items()}
    return cls.Params(**values)


def _checked(policy: str, key: str, hint: Any, value: Any) -> Any:
    """`value` for the Params field `key` annotated `hint`: right type, finite, or ConfigError.

    Numbers, booleans and strings are checked against the field's type; tuples and lists
    element by element. An int is accepted where a float is expected; a float where an int is
    expected only when it is whole (2.0). NaN and infinities are refused everywhere: no policy
    parameter means anything at NaN, and JSON reads 'NaN' and 'Infinity' as numbers.
    """
    where = f"policy {policy!r}: parameter {key}"

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


def parse_policy_params(items: str | list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """'ema-head.tolerate_loss=0.001,bayes-reuse.horizon_s=60' -> parameters per policy name.

    Values are read as JSON where they parse (numbers, true/false, quoted strings), else kept as
    text, so `--policy-param bayes-reuse.prefix_aware=false` works as typed."""
    if isinstance(items, str):
        items = [p for p in _split_top_level(items) if p.strip()]
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        policy, dot, field = key.strip().rpartition(".")
        if not sep or not dot or not policy or not field:
            raise ConfigError(f"policy parameter {item!r}: expected POLICY.NAME=VALUE")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text.strip()
        out.setdefault(policy, {})[field] = value
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


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> EvictionPolicy:
    """A fresh policy instance for one tier; ``params`` fill the policy's ``Params`` dataclass.

    Policies that are not built in run behind a guard that reports their exceptions as
    ``PluginError`` naming the policy and method; built-ins run bare, so they pay nothing.
    """
    cls = resolve_policy(name)
    builtin = _REGISTRY.is_builtin(name, cls)
    try:
        policy = cls(_build_params(cls, name, params)) if params else cls()
    except KvsimError:
        raise
    except Exception as exc:
        if builtin:
            raise
        raise PluginError(f"policy {name!r}: method '__init__' raised {_describe(exc)}") from exc
    return policy if builtin else GuardedPolicy(name, policy)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class GuardedPolicy(EvictionPolicy):
    """Delegates to a third-party policy, turning its exceptions into ``PluginError``.

    ``victim`` raising LookupError on an empty policy is the interface, not a fault, so it passes.
    """

    def __init__(self, label: str, inner: EvictionPolicy) -> None:
        self.label = label
        self.inner = inner
        self.name = getattr(inner, "name", "") or label  # type: ignore[misc]
        self.respects_prefix = inner.respects_prefix  # type: ignore[misc]
        self.needs_future = inner.needs_future  # type: ignore[misc]

    def _fail(self, method: str, exc: Exception) -> PluginError:
        return PluginError(f"policy {self.label!r}: method {method!r} raised {_describe(exc)}")

    def add(self, key: int, info: BlockInfo) -> None:
        try:
            self.inner.add(key, info)
        except Exception as exc:
            raise self._fail("add", exc) from exc

    def access(self, key: int, info: BlockInfo) -> None:
        try:
            self.inner.access(key, info)
        except Exception as exc:
            raise self._fail("access", exc) from exc

    def discard(self, key: int) -> None:
        try:
            self.inner.discard(key)
        except Exception as exc:
            raise self._fail("discard", exc) from exc

    def forget(self, key: int) -> None:
        try:
            self.inner.forget(key)
        except Exception as exc:
            raise self._fail("forget", exc) from exc

    def miss(self, key: int, info: BlockInfo) -> None:
        try:
            self.inner.miss(key, info)
        except Exception as exc:
            raise self._fail("miss", exc) from exc

    def set_capacity(self, blocks: int) -> None:
        try:
            self.inner.set_capacity(blocks)
        except Exception as exc:
            raise self._fail("set_capacity", exc) from exc

    def victim(self) -> int:
        try:
            return self.inner.victim()
        except LookupError:
            raise
        except Exception as exc:
            raise self._fail("victim", exc) from exc

    def __len__(self) -> int:
        try:
            return len(self.inner)
        except Exception as exc:
            raise self._fail("__len__", exc) from exc

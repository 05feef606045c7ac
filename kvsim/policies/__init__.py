"""Eviction policies by name: built-ins, the `kvsim.policies` entry-point group, and `module:Class`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from kvsim.errors import KvsimError, UnknownNameError
from kvsim.policies.base import BlockInfo, EvictionPolicy
from kvsim.policies.lru import LRU

__all__ = ["BlockInfo", "EvictionPolicy", "make_policy", "policy_names", "register"]

_BUILTINS: dict[str, type[EvictionPolicy]] = {}


def register(cls: type[EvictionPolicy]) -> type[EvictionPolicy]:
    """Add a built-in policy class under its ``name``; a duplicate name is a bug."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if cls.name in _BUILTINS:
        raise ValueError(f"policy {cls.name!r} registered twice")
    _BUILTINS[cls.name] = cls
    return cls


register(LRU)


def _plugins() -> dict[str, Callable[[], object]]:
    return {ep.name: ep.load for ep in entry_points(group="kvsim.policies")}


def policy_names() -> list[str]:
    """Every name ``make_policy`` accepts (built-ins and installed plugins)."""
    return sorted(set(_BUILTINS) | set(_plugins()))


def resolve_policy(name: str) -> type[EvictionPolicy]:
    """The policy class for a registered name or a ``module:Class`` path."""
    if name in _BUILTINS:
        return _BUILTINS[name]
    plugins = _plugins()
    if name in plugins:
        cls = plugins[name]()
    elif ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise KvsimError(f"policy {name!r}: cannot import {attr} from {module}: {exc}") from None
    else:
        raise UnknownNameError("policy", name, policy_names())
    if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
        raise KvsimError(f"policy {name!r} is not a kvsim.policies.EvictionPolicy subclass")
    return cls


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy instance for one tier."""
    return resolve_policy(name)()

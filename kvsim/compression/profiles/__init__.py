"""Compression profiles by name: one module per profile, a registry, and the parser.

``parse_compression("NAME[:key=value,…]")`` finds the profile class registered under NAME (a
built-in here, or one installed through the ``kvsim.compression`` entry-point group) and lets it
parse the rest. A new profile is one module: a ``Compression`` subclass with its name, keys and
rules, passed to ``register`` (examples/extend/compression_profile.py is a worked example).
"""

from __future__ import annotations

from kvsim.compression.base import Compression, Key, LayerConfig
from kvsim.compression.profiles.auto import DEFAULT_AUTO_CANDIDATES, Auto
from kvsim.compression.profiles.h2o import H2O
from kvsim.compression.profiles.infinigen import InfiniGen
from kvsim.compression.profiles.kvp import KVP
from kvsim.compression.profiles.lkv import LKV
from kvsim.compression.profiles.moe_nd import MoEnD
from kvsim.compression.profiles.none import NoCompression
from kvsim.compression.profiles.quant import Quant
from kvsim.compression.profiles.snapkv import SnapKV
from kvsim.compression.profiles.streaming import StreamingLLM
from kvsim.errors import ConfigError
from kvsim.plugins import Registry

__all__ = [
    "DEFAULT_AUTO_CANDIDATES",
    "PROFILES",
    "Compression",
    "Key",
    "LayerConfig",
    "parse_compression",
    "profile_class",
    "profile_names",
    "register",
]

_REGISTRY: Registry[Compression] = Registry("compression profile", Compression, "kvsim.compression")
#: Registers a ``Compression`` subclass under its ``name``; a second one of that name raises.
register = _REGISTRY.register

for _cls in (
    NoCompression,
    StreamingLLM,
    H2O,
    SnapKV,
    LKV,
    KVP,
    Quant,
    MoEnD,
    InfiniGen,
    Auto,
):
    register(_cls)

#: Every registered profile class by name (the built-ins and any registered since).
PROFILES: dict[str, type[Compression]] = _REGISTRY.builtins


def profile_names() -> list[str]:
    """Every name ``parse_compression`` accepts (registered and installed plugins)."""
    return _REGISTRY.names()


def profile_class(name: str) -> type[Compression]:
    """The class registered (or installed) under ``name``; UnknownNameError lists the valid."""
    if ":" in name:  # the registry would read it as module:Class, which a profile text is not
        name = name.partition(":")[0]
    return _REGISTRY.resolve(name)


def parse_compression(text: str) -> Compression:
    """``NAME[:key=value,…]`` → the profile; ConfigError naming the bad key or value.

    ``auto`` takes candidate profiles separated by '|': ``auto:none|quant:k=4,v=4|h2o``; plain
    ``auto`` uses ``DEFAULT_AUTO_CANDIDATES``.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"compression: expected NAME[:key=value,...], got {text!r}")
    name, colon, rest = text.strip().partition(":")
    return profile_class(name.strip()).parse(rest if colon else "")

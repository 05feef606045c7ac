"""One registry shape for every pluggable kind (policies, routers): built-ins by name, installed
plugins through an entry-point group, and `module:Class` paths, with one-line errors."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from kvsim.errors import KvsimError, PluginError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Classes of one `kind` ("policy", "router"), all subclasses of `base`."""

    def __init__(self, kind: str, base: type[T], group: str) -> None:
        self.kind = kind
        self.base = base
        self.group = group
        self.builtins: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Add a built-in class under its ``name``; a missing or duplicate name is a bug."""
        name = getattr(cls, "name", "")
        if not name:
            raise ValueError(f"{cls.__qualname__} has no name")
        if name in self.builtins:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self.builtins[name] = cls
        return cls

    def plugins(self) -> dict[str, Callable[[], object]]:
        return {ep.name: ep.load for ep in entry_points(group=self.group)}

    def builtin_names(self) -> list[str]:
        return sorted(self.builtins)

    def names(self) -> list[str]:
        """Every name `resolve` accepts (built-ins and installed plugins)."""
        return sorted(set(self.builtins) | set(self.plugins()))

    def is_builtin(self, name: str, cls: type[T]) -> bool:
        return self.builtins.get(name) is cls

    def resolve(self, name: str) -> type[T]:
        """The class for a registered name, an entry point or a ``module:Class`` path."""
        if name in self.builtins:
            return self.builtins[name]
        kind = self.kind
        plugins = self.plugins()
        if name in plugins:
            try:
                cls = plugins[name]()
            except Exception as exc:
                raise PluginError(f"{kind} {name!r}: cannot load its entry point: {exc}") from None
        elif ":" in name:
            module, _, attr = name.partition(":")
            try:
                cls = getattr(importlib.import_module(module), attr)
            except Exception as exc:
                raise KvsimError(
                    f"{kind} {name!r}: cannot import {attr} from {module}: {exc}"
                ) from None
        else:
            raise UnknownNameError(kind, name, self.names())
        base = self.base
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise KvsimError(
                f"{kind} {name!r} is not a {base.__module__.rsplit('.', 1)[0]}.{base.__name__} "
                "subclass"
            )
        return cls

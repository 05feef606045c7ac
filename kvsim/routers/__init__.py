"""Routers by name: built-ins, the `kvsim.routers` entry points, and `module:Class`."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from kvsim.errors import KvsimError, PluginError
from kvsim.plugin_params import build_params, parse_params
from kvsim.plugins import Registry
from kvsim.routers.base import (
    ClusterView,
    PrefixMatch,
    ReplicaLoad,
    Router,
    RouteRequest,
)
from kvsim.routers.dynamo_kv import DynamoKv
from kvsim.routers.least_loaded import LeastLoaded
from kvsim.routers.llm_d import LlmD
from kvsim.routers.min_ttft import MinTtft
from kvsim.routers.power_of_two import PowerOfTwo
from kvsim.routers.production_stack import ProductionStack
from kvsim.routers.random_choice import RandomRouter
from kvsim.routers.round_robin import RoundRobin
from kvsim.routers.session import SessionRouter
from kvsim.routers.sglang_cache_aware import SglangCacheAware

__all__ = [
    "ClusterView",
    "GuardedRouter",
    "PrefixMatch",
    "ReplicaLoad",
    "RouteRequest",
    "Router",
    "builtin_router_names",
    "make_router",
    "parse_router_params",
    "register",
    "resolve_router",
    "router_names",
]

_REGISTRY: Registry[Router] = Registry("router", Router, "kvsim.routers")
register = _REGISTRY.register


for _cls in (
    RoundRobin,
    RandomRouter,
    LeastLoaded,
    PowerOfTwo,
    SessionRouter,
    DynamoKv,
    LlmD,
    SglangCacheAware,
    ProductionStack,
    MinTtft,
):
    register(_cls)


def builtin_router_names() -> list[str]:
    """The routers that ship with kvsim."""
    return _REGISTRY.builtin_names()


def router_names() -> list[str]:
    """Every name ``make_router`` accepts (built-ins and installed plugins)."""
    return _REGISTRY.names()


def resolve_router(name: str) -> type[Router]:
    """The router class for a registered name, an entry point or a ``module:Class`` path."""
    return _REGISTRY.resolve(name)


def parse_router_params(items: str | Sequence[str]) -> dict[str, dict[str, Any]]:
    """'dynamo-kv.overlap_score_weight=2' -> parameters per router name (kvsim.plugin_params)."""
    return parse_params(items, "router")


def check_router_params(name: str, params: Mapping[str, Any]) -> None:
    """Refuse parameters that router `name` would refuse, without building it."""
    build_params(resolve_router(name), "router", name, params)


def make_router(
    name: str, params: Mapping[str, Any] | None = None, rng: random.Random | None = None
) -> Router:
    """A fresh router for one run; ``params`` fill the router's ``Params`` dataclass and ``rng``
    is the run's seeded generator (a fixed-seed one when omitted).

    Routers that are not built in run behind a guard that reports their exceptions as
    ``PluginError`` naming the router and method; built-ins run bare, so they pay nothing.
    """
    cls = resolve_router(name)
    builtin = _REGISTRY.is_builtin(name, cls)
    rng = rng if rng is not None else random.Random(0)
    try:
        router = cls(build_params(cls, "router", name, params) if params else None, rng)
    except KvsimError:
        raise
    except Exception as exc:
        if builtin:
            raise
        raise PluginError(f"router {name!r}: method '__init__' raised {_describe(exc)}") from exc
    return router if builtin else GuardedRouter(name, router)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class GuardedRouter(Router):
    """Delegates to a third-party router, turning its exceptions, and a choice outside the
    candidates, into ``PluginError`` naming the router and method."""

    def __init__(self, label: str, inner: Router) -> None:
        self.label = label
        self.inner = inner
        self.name = getattr(inner, "name", "") or label  # type: ignore[misc]
        self.params = inner.params
        self.rng = inner.rng
        self.pd_threshold_tokens = inner.pd_threshold_tokens

    def _fail(self, method: str, why: str) -> PluginError:
        return PluginError(f"router {self.label!r}: method {method!r} {why}")

    def _checked(self, method: str, replica: Any, candidates: Sequence[int]) -> int:
        if replica not in candidates:
            raise self._fail(method, f"returned {replica!r}, not one of the candidates")
        return replica

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        try:
            replica = self.inner.choose(request, view, candidates)
        except KvsimError:
            raise
        except Exception as exc:
            raise self._fail("choose", f"raised {_describe(exc)}") from exc
        return self._checked("choose", replica, candidates)

    def choose_prefill(
        self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]
    ) -> int:
        try:
            replica = self.inner.choose_prefill(request, view, candidates)
        except KvsimError:
            raise
        except Exception as exc:
            raise self._fail("choose_prefill", f"raised {_describe(exc)}") from exc
        return self._checked("choose_prefill", replica, candidates)

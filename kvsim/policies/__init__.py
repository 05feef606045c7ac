"""Eviction policies by name: built-ins, the `kvsim.policies` entry points, and `module:Class`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvsim.errors import KvsimError, PluginError
from kvsim.plugin_params import build_params, parse_params
from kvsim.plugins import Registry
from kvsim.policies.arc import ARC
from kvsim.policies.asym_cost import AsymCost
from kvsim.policies.base import BlockInfo, EvictionPolicy, RequestHint
from kvsim.policies.bayes_reuse import BayesReuse
from kvsim.policies.bayes_reuse_v1 import BayesReuseV1
from kvsim.policies.belady import Belady
from kvsim.policies.ema_head import EmaHead
from kvsim.policies.fifo import FIFO
from kvsim.policies.gdsf import GDSF
from kvsim.policies.learned import Learned
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
from kvsim.policies.ttl_pin import TtlPin
from kvsim.policies.twoq import TwoQ
from kvsim.policies.vllm import VLLM
from kvsim.policies.wa import WorkloadAware

__all__ = [
    "BlockInfo",
    "EvictionPolicy",
    "GuardedPolicy",
    "RequestHint",
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
    BayesReuseV1,
    WorkloadAware,
    TtlPin,
    Learned,
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


def parse_policy_params(items: str | list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """'bayes-reuse.horizon_s=60' -> parameters per policy name (kvsim.plugin_params)."""
    return parse_params(items, "policy")


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> EvictionPolicy:
    """A fresh policy instance for one tier; ``params`` fill the policy's ``Params`` dataclass.

    Policies that are not built in run behind a guard that reports their exceptions as
    ``PluginError`` naming the policy and method; built-ins run bare, so they pay nothing.
    """
    cls = resolve_policy(name)
    builtin = _REGISTRY.is_builtin(name, cls)
    try:
        policy = cls(build_params(cls, "policy", name, params)) if params else cls()
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

    def evict(self, count: int) -> list[int]:
        """The plugin's own ``evict`` when it defines one (a batching plugin must evict as its
        author wrote it, issue 45); otherwise the base loop over the guarded ``victim``."""
        if not _overrides_evict(self.inner):
            return super().evict(count)
        try:
            victims = self.inner.evict(count)
        except LookupError:
            raise
        except Exception as exc:
            raise self._fail("evict", exc) from exc
        if not isinstance(victims, list):
            raise PluginError(
                f"policy {self.label!r}: method 'evict' returned {type(victims).__name__}, "
                "expected a list of block keys"
            )
        return victims

    def __len__(self) -> int:
        try:
            return len(self.inner)
        except Exception as exc:
            raise self._fail("__len__", exc) from exc


def _overrides_evict(policy: EvictionPolicy) -> bool:
    """Whether the policy's class defines its own ``evict`` rather than the base loop."""
    return type(policy).evict is not EvictionPolicy.evict

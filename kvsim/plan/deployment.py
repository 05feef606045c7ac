"""What a plan chooses: replicas, lower tiers and their sizes, router, P/D split.

A `Deployment` is one point of the search and turns into one `RunConfig`. A `Shape` is a
deployment without its replica count, the thing the replica search sizes: `Shape.at(n)` is the
deployment of n replicas, with a P/D shape keeping its prefill share as n changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvsim.engine.config import EngineConfig
from kvsim.hardware.tier_kinds import LOWER_TIER_NAMES, SHARED_TIER_NAMES
from kvsim.units import format_bytes

#: Tiers a plan sizes: the node-local ones and the shared pool.
SEARCHED_TIERS = tuple(t for t in LOWER_TIER_NAMES if t != "pfs")  # not the parallel FS

Tiers = tuple[tuple[str, int], ...]  # (tier, bytes per node, or of the pool), in LOWER_TIER_NAMES


def _ordered(tiers: dict[str, int]) -> Tiers:
    def rank(name: str) -> tuple[int, str]:
        return (
            LOWER_TIER_NAMES.index(name) if name in LOWER_TIER_NAMES else len(LOWER_TIER_NAMES),
            name,
        )

    return tuple((name, tiers[name]) for name in sorted(tiers, key=rank))


def tier_size_text(name: str, size: int) -> str:
    """'dram 1.8 TiB' for a node-local tier, 'rdma pool 7.3 TiB' for a shared one."""
    return f"{name} {'pool ' if name in SHARED_TIER_NAMES else ''}{format_bytes(size)}"


@dataclass(frozen=True)
class Deployment:
    """One fleet: `replicas` replicas behind `router`, `tiers` below HBM, optional (P, D) split."""

    replicas: int
    router: str
    tiers: Tiers = ()
    pd: tuple[int, int] | None = None

    def engine(self, base: EngineConfig) -> EngineConfig:
        """`base` with this deployment's fleet settings (exact byte sizes: nothing rounds)."""
        return dataclasses.replace(
            base,
            replicas=self.replicas,
            router=self.router,
            tiers=",".join(["hbm", *(name for name, _ in self.tiers)]),
            tier_capacity=",".join(f"{name}={size}B" for name, size in self.tiers),
            pd=f"{self.pd[0]}:{self.pd[1]}" if self.pd else "",
        )

    def describe(self) -> str:
        """'4 replicas, llm-d, dram 1.8 TiB, P/D 1:3' for tables and explanations."""
        parts = [f"{self.replicas} replica{'s' if self.replicas != 1 else ''}", self.router]
        parts += [tier_size_text(name, size) for name, size in self.tiers] or ["HBM only"]
        if self.pd:
            parts.append(f"P/D {self.pd[0]}:{self.pd[1]}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, object]:
        return {
            "replicas": self.replicas,
            "router": self.router,
            "tiers": dict(self.tiers),
            "pd": f"{self.pd[0]}:{self.pd[1]}" if self.pd else None,
        }


@dataclass(frozen=True)
class Shape:
    """A deployment without its replica count; `pd_share` is the prefill share under P/D."""

    router: str
    tiers: Tiers = ()
    pd_share: float | None = None

    def at(self, replicas: int) -> Deployment | None:
        """The deployment of `replicas` replicas; None for a P/D shape of fewer than two."""
        if self.pd_share is None:
            return Deployment(replicas, self.router, self.tiers)
        if replicas < 2:
            return None
        prefill = min(replicas - 1, max(1, round(replicas * self.pd_share)))
        return Deployment(replicas, self.router, self.tiers, (prefill, replicas - prefill))

    def with_tier(self, name: str, size: int) -> Shape:
        """This shape with tier `name` at `size` bytes (0: off)."""
        tiers = dict(self.tiers)
        tiers.pop(name, None)
        if size > 0:
            tiers[name] = size
        return dataclasses.replace(self, tiers=_ordered(tiers))

    def tier_size(self, name: str) -> int:
        return dict(self.tiers).get(name, 0)


def base_tiers(profile_tiers: list[tuple[str, int, bool]]) -> Tiers:
    """The profile's enabled lower tiers at their full capacity: (name, bytes, enabled) rows."""
    return _ordered({name: size for name, size, on in profile_tiers if on and name != "hbm"})

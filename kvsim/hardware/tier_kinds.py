"""The kinds of memory tier kvsim models, in one table: the only place a tier kind is named.

Each row says what the rest of kvsim needs to know about a kind: its order in the hierarchy
(fastest first: a profile lists its tiers in this order), whether one pool serves the whole
cluster (one capacity, one link) or each node has its own, the class routers price a load from
it by (the fastest tier of a class stands for it), and how reports name and colour it. The
numbers of a tier (capacity, bandwidth, latency, cost) are the hardware profile's.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import UnknownNameError


@dataclass(frozen=True)
class TierKind:
    name: str  # as profiles, options and results name it
    label: str  # as reports print it
    shared: bool  # one pool for the whole cluster, not one per node
    load_class: int  # 0 device, 1 host memory, 2 local disk, 3 remote: routers' load estimate
    colour: str  # the same in every figure


TIER_KINDS: tuple[TierKind, ...] = (
    TierKind("hbm", "HBM", shared=False, load_class=0, colour="#1f77b4"),
    TierKind("dram", "DRAM", shared=False, load_class=1, colour="#ff7f0e"),
    TierKind("cxl", "CXL", shared=False, load_class=1, colour="#2ca02c"),
    TierKind("nvme", "NVMe", shared=False, load_class=2, colour="#d62728"),
    TierKind("rdma", "RDMA pool", shared=True, load_class=3, colour="#9467bd"),
    TierKind("pfs", "parallel FS", shared=True, load_class=3, colour="#8c564b"),
)
_BY_NAME = {kind.name: kind for kind in TIER_KINDS}

TIER_NAMES: tuple[str, ...] = tuple(kind.name for kind in TIER_KINDS)
"""Every tier kvsim knows, fastest first; a profile lists a subset in this order."""
LOWER_TIER_NAMES: tuple[str, ...] = TIER_NAMES[1:]
"""The tiers below HBM, where evicted blocks go."""
SHARED_TIER_NAMES: tuple[str, ...] = tuple(kind.name for kind in TIER_KINDS if kind.shared)
"""Tiers that are one pool for the whole cluster: one capacity, one link."""


def tier_kind(name: str) -> TierKind:
    """The kind `name` names (UnknownNameError listing the valid ones)."""
    kind = _BY_NAME.get(name)
    if kind is None:
        raise UnknownNameError("tier", name, list(TIER_NAMES))
    return kind

"""Build a replica's memory hierarchy from the hardware profile and the engine settings.

A replica of `tp` GPUs gets `tp / gpus_per_node` of each node-local tier (its share of the
node's DRAM, CXL and NVMe, an assumption: replicas on a node split them evenly) and the
bandwidth of its own GPUs' paths (per-GPU figures x tp; per-node figures x the same share).

A shared tier (RDMA pool, parallel filesystem) is one object for the whole cluster: its capacity
is the cluster's share of a pool that `shared_by_nodes` nodes use (each replica's share, summed),
and its bandwidth is one link as wide as the cluster's paths to it (NICs or clients) together,
so one node's remote reads slow the others'. A replica may burst above its own NIC's share when
the others are idle (an assumption: the link has no per-node cap).
"""

from __future__ import annotations

import simpy

from kvsim.engine.config import EngineConfig
from kvsim.engine.settings import TierSettings
from kvsim.hardware.profile import HardwareProfile, TierSpec, with_overrides
from kvsim.kvcache.hierarchy import Hierarchy, LowerTier
from kvsim.kvcache.link import Link
from kvsim.policies import make_policy

SHARED_TIERS = ("rdma", "pfs")  # one pool for the whole cluster: one capacity, one link


def resolve_profile(profile: HardwareProfile, settings: TierSettings) -> HardwareProfile:
    """The profile with the run's tier selection and capacity overrides applied."""
    if settings.tiers is None and settings.capacities is None:
        return profile
    return with_overrides(profile, tiers=settings.tiers, capacities=settings.capacities)


def replica_share(profile: HardwareProfile, tier: TierSpec, tp: int) -> float:
    """The fraction of a tier's capacity one replica gets."""
    return tp / profile.gpus_per_node / max(tier.shared_by_nodes, 1)


def _bandwidths(profile: HardwareProfile, tier: TierSpec, gpus_used: int) -> tuple[float, float]:
    """The share of the node's bandwidth to `tier` that `gpus_used` GPUs' paths give."""
    gpus = profile.gpus_per_node
    share = gpus_used / gpus
    return (
        tier.node_read_bandwidth_bytes_per_s(gpus) * share,
        tier.node_write_bandwidth_bytes_per_s(gpus) * share,
    )


def _link(env: simpy.Environment, profile: HardwareProfile, tier: TierSpec, gpus_used: int) -> Link:
    read, write = _bandwidths(profile, tier, gpus_used)
    return Link(env, tier.name, read, write, tier.latency_s)


def fabric_link(
    env: simpy.Environment, profile: HardwareProfile, tp: int, replicas: int
) -> Link | None:
    """The cluster's one inter-node fabric: every node's NICs (the rdma tier's per-node
    bandwidth, tp/gpus_per_node of a node per replica) pooled into one processor-sharing link,
    so remote-pool reads, write-backs, prefetches and P/D hand-offs all slow each other.
    None for a profile that describes no rdma tier (a single machine, e.g. a CPU calibration)."""
    if not any(spec.name == "rdma" for spec in profile.tiers):
        return None
    return _link(env, profile, profile.tier("rdma"), tp * replicas)


def build_shared_tiers(
    env: simpy.Environment,
    profile: HardwareProfile,
    config: EngineConfig,
    settings: TierSettings,
    block_bytes: int,
    replicas: int,
    fabric: Link | None,
) -> dict[str, LowerTier]:
    """The enabled shared tiers, built once: the cluster's share of the pool (each replica's
    share, summed, at most the whole pool) behind one link. rdma rides the fabric."""
    out: dict[str, LowerTier] = {}
    where: dict[int, int] = {}  # one placement map for every shared tier
    for spec in profile.tiers:
        if spec.name not in SHARED_TIERS or not spec.enabled:
            continue
        share = min(replicas * replica_share(profile, spec, config.tp), 1.0)
        if spec.name == "rdma" and fabric is not None:
            link = fabric
        else:
            link = _link(env, profile, spec, config.tp * replicas)
        out[spec.name] = LowerTier(
            name=spec.name,
            index=-1,  # set by each hierarchy: the same in all, since all enable the same tiers
            capacity_blocks=int(spec.capacity_bytes * share // block_bytes),
            policy=make_policy(settings.policies[spec.name], settings.params_of(spec.name)),
            link=link,
            admission=settings.admissions[spec.name],
            where=where,
        )
    return out


def build_hierarchy(
    env: simpy.Environment,
    profile: HardwareProfile,
    config: EngineConfig,
    settings: TierSettings,
    block_bytes: int,
    in_hbm,
    shared: dict[str, LowerTier],
) -> Hierarchy:
    """One replica's enabled tiers below HBM, each with its policy, admission rule and link;
    node-local tiers are its own share, `shared` ones are the cluster's."""
    tiers: list[LowerTier] = []
    links: dict[str, Link] = {}
    for spec in profile.tiers:
        if spec.name == "hbm" or not spec.enabled:
            continue
        if spec.name in shared:
            tier = shared[spec.name]
            tier.index = len(tiers)
            tiers.append(tier)
            continue
        blocks = int(spec.capacity_bytes * replica_share(profile, spec, config.tp) // block_bytes)
        link = links[spec.name] = _link(env, profile, spec, config.tp)
        bounce = None
        if spec.name == "nvme" and spec.path == "bounce":
            host = profile.tier("dram")
            bounce = links.get("dram") or _link(env, profile, host, config.tp)
        tiers.append(
            LowerTier(
                name=spec.name,
                index=len(tiers),
                capacity_blocks=blocks,
                policy=make_policy(settings.policies[spec.name], settings.params_of(spec.name)),
                link=link,
                admission=settings.admissions[spec.name],
                bounce=bounce,
            )
        )
    return Hierarchy(
        env,
        tiers,
        block_bytes,
        write_through=config.write_policy == "write-through",
        inclusive=config.hierarchy == "inclusive",
        in_hbm=in_hbm,
    )


def hourly_cost_usd(
    profile: HardwareProfile, config: EngineConfig, replicas: int = 1
) -> dict[str, float]:
    """$ per hour of the replicas: their GPUs, their shares of each node-local tier below HBM,
    and the cluster's share of each shared tier."""
    out = {"gpu": profile.gpu_usd_per_hour * config.tp * replicas}
    for spec in profile.tiers:
        if spec.name != "hbm" and spec.enabled:
            share = replica_share(profile, spec, config.tp)
            share = min(replicas * share, 1.0) if spec.name in SHARED_TIERS else replicas * share
            out[spec.name] = spec.capacity_bytes * share / 1e9 * spec.usd_per_gb_hour
    return out

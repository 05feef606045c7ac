"""Build a replica's memory hierarchy from the hardware profile and the engine settings.

A replica of `tp` GPUs gets `tp / gpus_per_node` of each node-local tier (its share of the
node's DRAM, CXL and NVMe, an assumption: replicas on a node split them evenly) and the
bandwidth of its own GPUs' paths (per-GPU figures x tp; per-node figures x the same share). A
shared tier (RDMA pool, parallel filesystem) is split further among the `shared_by_nodes` nodes
that use it, so each replica sees its fair share of the pool's capacity; bandwidth is the node's
own path to the pool (NIC or client), which is what limits one node.
"""

from __future__ import annotations

import simpy

from kvsim.engine.config import EngineConfig
from kvsim.errors import ConfigError, UnknownNameError
from kvsim.hardware.profile import HardwareProfile, TierSpec, with_overrides
from kvsim.kvcache.hierarchy import ADMISSIONS, Hierarchy, LowerTier
from kvsim.kvcache.link import Link
from kvsim.policies import make_policy, parse_policy_params

TIER_ORDER = ("hbm", "dram", "cxl", "nvme", "rdma", "pfs")


def per_tier(text: str, option: str, default: str) -> dict[str, str]:
    """'lru' -> every tier 'lru'; 'hbm=lru,dram=arc' -> those tiers, `default` for the rest."""
    text = text.strip()
    if "=" not in text:
        return dict.fromkeys(TIER_ORDER, text or default)
    out = dict.fromkeys(TIER_ORDER, default)
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not value:
            raise ConfigError(f"{option}: expected NAME=VALUE pairs, got {part!r}")
        if name not in TIER_ORDER:
            raise UnknownNameError("tier", name, list(TIER_ORDER))
        out[name] = value
    return out


def resolve_profile(profile: HardwareProfile, config: EngineConfig) -> HardwareProfile:
    """The profile with the config's tier selection and capacity overrides applied."""
    tiers = None
    if config.tiers:
        names = [t.strip() for t in config.tiers.split(",") if t.strip()]
        tiers = list(TIER_ORDER) if names == ["all"] else names
    capacities = None
    if config.tier_capacity.strip():
        capacities = {}
        for part in config.tier_capacity.split(","):
            name, sep, size = part.partition("=")
            if not sep:
                raise ConfigError(f"tier capacity: expected NAME=SIZE, got {part!r}")
            if name.strip() == "hbm":
                raise ConfigError(
                    "tier capacity hbm: HBM for KV follows from the GPU and the model; "
                    "use --num-gpu-blocks to set it"
                )
            capacities[name.strip()] = size.strip()
    if tiers is None and capacities is None:
        return profile
    return with_overrides(profile, tiers=tiers, capacities=capacities)


def replica_share(profile: HardwareProfile, tier: TierSpec, tp: int) -> float:
    """The fraction of a tier's capacity one replica gets."""
    return tp / profile.gpus_per_node / max(tier.shared_by_nodes, 1)


def _bandwidths(profile: HardwareProfile, tier: TierSpec, tp: int) -> tuple[float, float]:
    """The replica's share of the node's bandwidth to `tier`: its tp GPUs' paths."""
    gpus = profile.gpus_per_node
    share = tp / gpus
    return (
        tier.node_read_bandwidth_bytes_per_s(gpus) * share,
        tier.node_write_bandwidth_bytes_per_s(gpus) * share,
    )


def _link(env: simpy.Environment, profile: HardwareProfile, tier: TierSpec, tp: int) -> Link:
    read, write = _bandwidths(profile, tier, tp)
    return Link(env, tier.name, read, write, tier.latency_s)


def build_hierarchy(
    env: simpy.Environment,
    profile: HardwareProfile,
    config: EngineConfig,
    block_bytes: int,
    in_hbm,
) -> Hierarchy:
    """The enabled tiers below HBM, each with its policy, admission rule and link."""
    policies = per_tier(config.policy, "policy", "lru")
    params = parse_policy_params(config.policy_params)
    admissions = per_tier(config.admission, "admission", "all")
    for name, rule in admissions.items():
        if rule not in ADMISSIONS:
            raise ConfigError(f"admission {name}={rule}: expected one of {', '.join(ADMISSIONS)}")
    tiers: list[LowerTier] = []
    links: dict[str, Link] = {}
    for spec in profile.tiers:
        if spec.name == "hbm" or not spec.enabled:
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
                policy=make_policy(policies[spec.name], params.get(policies[spec.name])),
                link=link,
                admission=admissions[spec.name],
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


def hourly_cost_usd(profile: HardwareProfile, config: EngineConfig) -> dict[str, float]:
    """$ per hour of the replica: its GPUs, and its share of each enabled tier below HBM."""
    out = {"gpu": profile.gpu_usd_per_hour * config.tp}
    for spec in profile.tiers:
        if spec.name != "hbm" and spec.enabled:
            gigabytes = spec.capacity_bytes * replica_share(profile, spec, config.tp) / 1e9
            out[spec.name] = gigabytes * spec.usd_per_gb_hour
    return out

"""Build a replica's memory hierarchy from the hardware profile and the engine settings.

A replica of `tp` GPUs gets `tp / gpus_per_node` of each node-local tier (its share of the
node's DRAM, CXL and NVMe, an assumption: replicas on a node split them evenly) and the
bandwidth of its own GPUs' paths (per-GPU figures x tp; per-node figures x the same share).

A shared tier (RDMA pool, parallel filesystem) is one object for the whole cluster: its capacity
is the cluster's share of a pool that `shared_by_nodes` nodes use (each replica's share, summed),
and its bandwidth is one link as wide as the cluster's paths to it (NICs or clients) together,
so one node's remote reads slow the others'. A replica may burst above its own NIC's share when
the others are idle (an assumption: the link has no per-node cap).

A node-local tier whose profile says `bandwidth_sharing = "active"` (the NVMe drives) is one link
per node instead: the replicas reading share the node's bandwidth, and one reading alone gets up
to its GPUs' own host links or the drives, whichever is lower (GDS measured one GPU bound by its
PCIe link and four GPUs by the drives, hardware.md S27).

Each DMA copy costs the tier's `transfer_overhead` on top of its bytes; how many copies move one
block follows the profile's `block_layout` and the model's KV layers (`block_pieces`).
"""

from __future__ import annotations

import simpy

from kvsim.engine.config import EngineConfig
from kvsim.engine.settings import TierSettings
from kvsim.hardware.profile import HardwareProfile, TierSpec, with_overrides
from kvsim.hardware.tier_kinds import SHARED_TIER_NAMES
from kvsim.kvcache.hierarchy import Hierarchy, LowerTier
from kvsim.kvcache.link import Link
from kvsim.models import ModelSpec
from kvsim.policies import make_policy


def resolve_profile(profile: HardwareProfile, settings: TierSettings) -> HardwareProfile:
    """The profile with the run's tier selection and capacity overrides applied."""
    if settings.tiers is None and settings.capacities is None:
        return profile
    return with_overrides(profile, tiers=settings.tiers, capacities=settings.capacities)


def node_of(index: int, tp: int, gpus_per_node: int) -> int:
    """The node replica `index` sits on when replicas fill nodes in order."""
    return index * tp // gpus_per_node


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
    return Link(env, tier.name, read, write, tier.latency_s, tier.transfer_overhead_s)


def layer_pieces(model: ModelSpec) -> tuple[int, int]:
    """(layers holding KV, KV tensors over those layers): the DMA copies one block takes when it
    is split per layer, and when K and V are apart too (an MLA latent is one tensor)."""
    layers = sum(g.kv_layers for g in model.layer_groups)
    tensors = sum(g.kv_layers * (1 if g.kind == "mla" else 2) for g in model.layer_groups)
    return max(layers, 1), max(tensors, 1)


def pieces_per_block(tier: TierSpec, pieces: tuple[int, int]) -> int:
    """DMA copies that move one block of `tier` (vLLM's KV offloading post, blog.vllm.ai
    2026-01-08: one per block since vLLM 0.12's contiguous layout; before, one per layer, or two
    where the attention backend keeps K and V apart)."""
    if tier.block_layout == "per_layer":
        return pieces[0]
    if tier.block_layout == "per_layer_kv":
        return pieces[1]
    return 1


def gpu_read_cap_bytes_per_s(profile: HardwareProfile) -> float:
    """What one GPU's own host link can carry into HBM: the dram tier's measured host-to-device
    rate when the profile gives one per GPU, else the link's spec, whichever is lower."""
    cap = profile.gpu.host_link_bandwidth_bytes_per_s
    for spec in profile.tiers:
        if spec.name == "dram" and spec.bandwidth_scope == "per_gpu":
            cap = min(cap, spec.read_bandwidth_bytes_per_s)
    return cap


def node_link(env: simpy.Environment, profile: HardwareProfile, tier: TierSpec, tp: int) -> Link:
    """The one link to a node's `active`-shared tier: the node's whole bandwidth (several nodes'
    for a replica wider than one), at most `tp` GPUs' host links for each replica reading."""
    nodes = max(tp / profile.gpus_per_node, 1.0)
    gpus = profile.gpus_per_node
    return Link(
        env,
        tier.name,
        tier.node_read_bandwidth_bytes_per_s(gpus) * nodes,
        tier.node_write_bandwidth_bytes_per_s(gpus) * nodes,
        tier.latency_s,
        tier.transfer_overhead_s,
        source_cap_bytes_per_s=gpu_read_cap_bytes_per_s(profile) * tp,
    )


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
    pieces: tuple[int, int] = (1, 1),
) -> dict[str, LowerTier]:
    """The enabled shared tiers, built once: the cluster's share of the pool (each replica's
    share, summed, at most the whole pool) behind one link. rdma rides the fabric."""
    out: dict[str, LowerTier] = {}
    where: dict[int, int] = {}  # one placement map for every shared tier
    for spec in profile.tiers:
        if spec.name not in SHARED_TIER_NAMES or not spec.enabled:
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
            pieces_per_block=pieces_per_block(spec, pieces),
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
    pieces: tuple[int, int] = (1, 1),
    node: int = 0,
    node_links: dict[tuple[str, int], Link] | None = None,
    source: int = 0,
) -> Hierarchy:
    """One replica's enabled tiers below HBM, each with its policy, admission rule and link;
    node-local tiers are its own share, `shared` ones are the cluster's. A tier shared by the
    replicas reading (`bandwidth_sharing = "active"`) rides one link per node, kept in
    `node_links` across the replicas; `source` tells this replica apart on it. `pieces` is
    `layer_pieces` of the model."""
    if node_links is None:
        node_links = {}
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
        if spec.bandwidth_sharing == "active":
            key = (spec.name, node)
            if key not in node_links:
                node_links[key] = node_link(env, profile, spec, config.tp)
            link = links[spec.name] = node_links[key]
        else:
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
                pieces_per_block=pieces_per_block(spec, pieces),
            )
        )
    return Hierarchy(
        env,
        tiers,
        block_bytes,
        write_through=config.write_policy == "write-through",
        inclusive=config.hierarchy == "inclusive",
        in_hbm=in_hbm,
        source=source,
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
            share = (
                min(replicas * share, 1.0) if spec.name in SHARED_TIER_NAMES else replicas * share
            )
            out[spec.name] = spec.capacity_bytes * share / 1e9 * spec.usd_per_gb_hour
    return out


def host_link(
    env: simpy.Environment, profile: HardwareProfile, config: EngineConfig, hierarchy: Hierarchy
) -> Link:
    """The replica's path to host DRAM: the dram tier's link when the tier is enabled (so
    offloaded KV fetches and tier traffic share it), else one like it, else the GPUs' host
    links (a profile without a dram tier)."""
    for tier in hierarchy.tiers:
        if tier.name == "dram":
            return tier.link
    for spec in profile.tiers:
        if spec.name == "dram":
            return _link(env, profile, spec, config.tp)
    rate = profile.gpu.host_link_bandwidth_bytes_per_s * config.tp
    return Link(env, "host", rate, rate, 0.0)

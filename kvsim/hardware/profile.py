"""What a node offers the simulator: its GPU, how well software uses it, and its KV-cache tiers.

Everything is in plain SI numbers (bytes, bytes per second, seconds, US dollars) so the engine and
cost model never parse units; the TOML files and kvsim.hardware.validate do that once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvsim.errors import ConfigError, UnknownNameError
from kvsim.units import parse_size

BandwidthScope = Literal["per_gpu", "per_node"]
NvmePath = Literal["gds", "bounce"]
BlockLayout = Literal["contiguous", "per_layer", "per_layer_kv"]
BandwidthSharing = Literal["fixed", "active"]
BLOCK_LAYOUTS: tuple[str, ...] = ("contiguous", "per_layer", "per_layer_kv")
"""How a KV block lies in HBM, so how many DMA copies moving one block takes: one (all layers in
one contiguous run, vLLM >= 0.12), one per layer, or one per layer for K and one for V."""
BANDWIDTH_SHARINGS: tuple[str, ...] = ("fixed", "active")
"""How replicas on a node share a per-node tier's bandwidth: each its fixed tp/gpus_per_node share,
or the replicas reading at the moment share all of it (one reading alone gets up to its GPUs'
own link limit)."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU's peaks, the inputs of the roofline cost model."""

    name: str
    hbm_bytes: int
    hbm_bandwidth_bytes_per_s: float
    peak_flops_per_s: dict[str, float]  # dense, by dtype: "bf16", "fp8"
    interconnect_bandwidth_bytes_per_s: float  # scale-up link (NVLink/IF), per GPU, per direction
    host_link_bandwidth_bytes_per_s: float  # PCIe or C2C to the host, per GPU, per direction


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How far real kernels fall short of the peaks, so the roofline predicts achieved speed.

    The defaults of the optional terms give the plain roofline; kvsim.costmodel.kernels says what
    each term models and docs/validation.md what fitting them to measurements gained."""

    compute: float  # achieved / peak FLOP/s of GEMMs
    memory: float  # achieved / peak HBM bandwidth
    # CPU time per engine iteration (schedule, prepare, sample): None is the engine profile's
    # (kvsim.engines); a hardware profile gives it where it measured its own (kvsim calibrate)
    iteration_overhead_s: float | None = None
    attention: float | None = None  # achieved / peak FLOP/s of prefill attention (None: compute)
    ridge_sharpness: float = math.inf  # p of the p-norm joining compute and memory time
    kernel_floor_s: float = 0.0  # fixed cost of each GEMM or elementwise kernel
    attention_floor_s: float = 0.0  # fixed cost of one layer's attention kernel
    elementwise: float | None = None  # achieved / peak bandwidth of norms etc. (None: memory)
    elementwise_floor_s: float = 0.0  # fixed cost of each elementwise kernel
    request_overhead_s: float | None = None  # per request: front end (None: the engine's)
    # decode attention is bandwidth-bound: the share of HBM bandwidth it reaches (None: the
    # old single attention term prices decode and prefill together), and its fixed cost
    decode_attention: float | None = None
    decode_attention_floor_s: float | None = None
    # FlashAttention's prefill efficiency rises with the chunk's length n: it reaches
    # `attention` x n / (n + attention_ramp_tokens) (None: `attention` at any length)
    attention_ramp_tokens: float | None = None
    # decode attention's cost per sequence per layer, beyond its KV reads (None: 0)
    decode_attention_per_sequence_s: float | None = None

    @property
    def attention_or_compute(self) -> float:
        return self.compute if self.attention is None else self.attention

    @property
    def elementwise_or_memory(self) -> float:
        return self.memory if self.elementwise is None else self.elementwise


@dataclass(frozen=True, slots=True)
class AllReduceAlgorithm:
    """One way to all-reduce across the GPUs of a node (NCCL ring, NVLS, a custom one-shot).

    Time of one call: ``latency + latency_per_gpu * (tp - 1) + bytes * 2 (tp - 1) / tp /
    bus_bandwidth`` (nccl-tests' bus bandwidth); the cheapest algorithm for the size wins."""

    name: str
    latency_s: float
    latency_per_gpu_s: float
    bus_bandwidth_bytes_per_s: float
    min_gpus: int = 2
    max_bytes: float | None = None  # the largest message it takes (vLLM's custom all-reduce)


@dataclass(frozen=True, slots=True)
class EngineKernels:
    """How this GPU's kernels run under one serving engine (a hardware profile's
    ``[engines.NAME]`` table): [efficiency] terms it replaces, and its all-reduce algorithms
    (none: the profile's [[allreduce]])."""

    efficiency: dict[str, float]
    allreduce: tuple[AllReduceAlgorithm, ...] = ()


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One level of the KV-cache hierarchy, seen from the GPUs of one node.

    Bandwidths are those of the path between the tier and HBM (read: into HBM, write: out of it).
    For a shared tier (``shared_by_nodes > 1``) ``capacity_bytes`` is the whole pool, which that
    many nodes contend for.
    """

    name: str
    capacity_bytes: int
    read_bandwidth_bytes_per_s: float
    write_bandwidth_bytes_per_s: float
    bandwidth_scope: BandwidthScope
    latency_s: float
    usd_per_gb_hour: float
    shared_by_nodes: int
    enabled: bool
    path: NvmePath | None  # nvme only: GPUDirect Storage or a bounce through host DRAM
    faster_than_above_note: str | None = None
    # each DMA copy's fixed cost (setup, descriptor, completion), paid once per copy on top of
    # bytes / bandwidth, so small copies reach a fraction of the bandwidth (0: size-blind)
    transfer_overhead_s: float = 0.0
    block_layout: BlockLayout = "contiguous"  # copies per block: see BLOCK_LAYOUTS
    bandwidth_sharing: BandwidthSharing = "fixed"  # see BANDWIDTH_SHARINGS

    def node_read_bandwidth_bytes_per_s(self, gpus_per_node: int) -> float:
        """Read bandwidth for the whole node, so tiers of either scope compare."""
        scale = gpus_per_node if self.bandwidth_scope == "per_gpu" else 1
        return self.read_bandwidth_bytes_per_s * scale

    def node_write_bandwidth_bytes_per_s(self, gpus_per_node: int) -> float:
        """Write bandwidth for the whole node."""
        scale = gpus_per_node if self.bandwidth_scope == "per_gpu" else 1
        return self.write_bandwidth_bytes_per_s * scale


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One node type: GPUs, efficiencies, prices and tiers, with the source of every number."""

    name: str
    description: str
    gpu: GpuSpec
    gpus_per_node: int
    gpu_usd_per_hour: float
    gpu_memory_utilization: float  # share of HBM the serving engine may use (weights + KV)
    efficiency: Efficiency
    tiers: tuple[TierSpec, ...]  # fastest first
    sources: dict[str, str]  # field path ("tiers.dram.read_bandwidth") -> where the number is from
    source_path: Path | None
    measured: dict[str, Any] = field(default_factory=dict)  # calibration tables, kept as read
    allreduce: tuple[AllReduceAlgorithm, ...] = ()  # none given: a ring at the NVLink bandwidth
    # kernel terms measured under a serving engine, by the name engine profiles ask for
    engines: dict[str, EngineKernels] = field(default_factory=dict)

    @property
    def allreduce_algorithms(self) -> tuple[AllReduceAlgorithm, ...]:
        """The profile's all-reduce algorithms, or a latency-free ring over the interconnect."""
        if self.allreduce:
            return self.allreduce
        bw = self.gpu.interconnect_bandwidth_bytes_per_s
        return (AllReduceAlgorithm("ring", 0.0, 0.0, bw),)

    def tier(self, name: str) -> TierSpec:
        """The tier called ``name``, enabled or not."""
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise UnknownNameError("tier", name, [t.name for t in self.tiers])

    @property
    def enabled_tiers(self) -> tuple[TierSpec, ...]:
        """The tiers a run uses, fastest first."""
        return tuple(t for t in self.tiers if t.enabled)


def with_overrides(
    profile: HardwareProfile,
    tiers: list[str] | None = None,
    capacities: dict[str, str | int] | None = None,
) -> HardwareProfile:
    """A copy with exactly ``tiers`` enabled (hbm always is) and some capacities replaced.

    ``capacities`` maps tier names to sizes such as ``{"dram": "1TiB"}``; the sources record the
    override so a resolved config still says where each number came from. A size given as text
    must carry its unit: ``"1000"`` is refused (it would be 1000 bytes, too small to hold one
    block, which silently disables the tier) with a hint to write ``"1000GB"``. An ``int`` from
    Python code is unambiguous and is taken as bytes.
    """
    known = [t.name for t in profile.tiers]
    for name in [*(tiers or []), *(capacities or {})]:
        if name not in known:
            raise UnknownNameError("tier", name, known)
    sources = dict(profile.sources)
    new_tiers = []
    for tier in profile.tiers:
        changes: dict[str, Any] = {}
        if tiers is not None:
            changes["enabled"] = tier.name == "hbm" or tier.name in tiers
        if capacities and tier.name in capacities:
            text = capacities[tier.name]
            size = parse_size(text, f"capacity override {tier.name}={text}", unit_required=True)
            if size <= 0:
                raise ConfigError(f"capacity override {tier.name}={text}: expected a positive size")
            from kvsim.hardware.validate import implausible  # (validate imports this module)

            problem = implausible("capacity", size)
            if problem:
                raise ConfigError(f"capacity override {tier.name}={text}: {problem}")
            changes["capacity_bytes"] = size
            sources[f"tiers.{tier.name}.capacity"] = f"override: {tier.name}={text}"
        new_tiers.append(dataclasses.replace(tier, **changes) if changes else tier)
    return dataclasses.replace(profile, tiers=tuple(new_tiers), sources=sources)

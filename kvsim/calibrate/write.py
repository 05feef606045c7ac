"""Turn measurements into a hardware profile file that ``validate_profile`` accepts.

A GPU calibration starts from the shipped profile of that GPU (``--base``): the datasheet peaks
stay (they are the roofline extrapolation relaxes to), the host-link tier and the iteration
overhead take measured values, and ``[measured]`` holds the tables. A CPU run has no datasheet,
so its "peaks" are the best rates it measured and its efficiencies are 1.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from typing import Any

from kvsim.hardware.profile import Efficiency, GpuSpec, HardwareProfile, TierSpec
from kvsim.tomlwrite import dumps


def _best_rates(measured: dict[str, Any]) -> tuple[float, float, float]:
    """(best GEMM FLOP/s, best copy bytes/s, best storage read bytes/s) in the tables."""
    flops = 0.0
    for g in measured["gemm"].values():
        for m, t in zip(g["tokens"], g["seconds"], strict=True):
            flops = max(flops, 2.0 * m * g["k"] * g["n"] / t)
    copy = max(
        b / t
        for doc in measured["copy"].values()
        for b, t in zip(doc["bytes"], doc["seconds"], strict=True)
    )
    st = measured["storage"]
    storage = max(b / t for b, t in zip(st["bytes"], st["seconds"], strict=True))
    return flops, copy, storage


def _latency(doc: dict[str, Any], bandwidth: float) -> float:
    """Fixed time of one transfer: the smallest one's time less its bytes at full speed."""
    return max(1e-7, doc["seconds"][0] - doc["bytes"][0] / bandwidth)


def _asymptote(doc: dict[str, Any]) -> float:
    return doc["bytes"][-1] / doc["seconds"][-1]


def cpu_profile(name: str, measured: dict[str, Any], storage_dir: str | None) -> HardwareProfile:
    """A one-"GPU" node whose device is this CPU, with the best measured rates as its peaks."""
    flops, copy, _storage = _best_rates(measured)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    disk = shutil.disk_usage(storage_dir or os.environ.get("TMPDIR", "/tmp")).free
    stamp = f"measured: kvsim calibrate on {measured['device']}, {measured['date']}"
    gpu = GpuSpec(
        name=measured["device"],
        hbm_bytes=ram,
        hbm_bandwidth_bytes_per_s=2 * copy,
        peak_flops_per_s={measured["dtype"]: flops},
        interconnect_bandwidth_bytes_per_s=2 * copy,
        host_link_bandwidth_bytes_per_s=copy,
    )
    h2d, d2h = measured["copy"]["h2d"], measured["copy"]["d2h"]
    nvme_bw = _asymptote(measured["storage"])
    tiers = (
        TierSpec("hbm", ram, 2 * copy, 2 * copy, "per_gpu", 1e-7, 0.0, 1, True, None),
        TierSpec(
            "dram",
            ram,
            _asymptote(h2d),
            _asymptote(d2h),
            "per_gpu",
            _latency(h2d, _asymptote(h2d)),
            0.0,
            1,
            False,
            None,
        ),
        TierSpec(
            "nvme",
            max(disk, 1),
            nvme_bw,
            nvme_bw / 2,
            "per_node",
            _latency(measured["storage"], nvme_bw),
            0.0,
            1,
            False,
            "bounce",
        ),
    )
    if nvme_bw > tiers[1].read_bandwidth_bytes_per_s:
        tiers = (
            *tiers[:2],
            dataclasses.replace(
                tiers[2],
                faster_than_above_note=(
                    "measured: file reads beat the memory copy (page cache or a fast file system)"
                ),
            ),
        )
    sources = {
        "gpus_per_node": "assumption: a CPU calibration is one device",
        "gpu_usd_per_hour": "assumption: a CPU calibration run has no price",
        "gpu_memory_utilization": "assumption: vLLM's default 0.9",
        "gpu.hbm": f"{stamp}: physical memory",
        "gpu.hbm_bandwidth": f"{stamp}: 2 x the best memory-copy rate (read + write)",
        f"gpu.flops.{measured['dtype']}": f"{stamp}: best achieved GEMM rate",
        "gpu.interconnect_bandwidth": "assumption: no tensor parallelism on a CPU; memory rate",
        "gpu.host_link_bandwidth": f"{stamp}: best memory-copy rate",
        "efficiency.compute": "assumption: the peaks are already achieved rates",
        "efficiency.memory": "assumption: the peaks are already achieved rates",
        "efficiency.iteration_overhead_s": f"{stamp}: fitted from forward passes",
        "tiers.hbm.capacity": f"{stamp}: physical memory",
        "tiers.hbm.read_bandwidth": f"{stamp}: as gpu.hbm_bandwidth",
        "tiers.hbm.write_bandwidth": f"{stamp}: as gpu.hbm_bandwidth",
        "tiers.hbm.latency": "assumption: 100 ns",
        "tiers.hbm.usd_per_gb_hour": "assumption: no price",
        "tiers.dram.capacity": f"{stamp}: physical memory",
        "tiers.dram.read_bandwidth": f"{stamp}: largest copy",
        "tiers.dram.write_bandwidth": f"{stamp}: largest copy",
        "tiers.dram.latency": f"{stamp}: smallest copy less its bytes at full rate",
        "tiers.dram.usd_per_gb_hour": "assumption: no price",
        "tiers.nvme.capacity": f"{stamp}: free space where the read file was written",
        "tiers.nvme.read_bandwidth": f"{stamp}: largest sequential read",
        "tiers.nvme.write_bandwidth": "assumption: half the read rate (not measured)",
        "tiers.nvme.latency": f"{stamp}: smallest read less its bytes at full rate",
        "tiers.nvme.usd_per_gb_hour": "assumption: no price",
    }
    return HardwareProfile(
        name=name,
        description=f"CPU calibration: {measured['device']} ({measured['date']})",
        gpu=gpu,
        gpus_per_node=1,
        gpu_usd_per_hour=0.0,
        gpu_memory_utilization=0.9,
        efficiency=Efficiency(1.0, 1.0, measured["overhead_s"]),
        tiers=tiers,
        sources=sources,
        source_path=None,
        measured=measured,
    )


def gpu_profile(name: str, base: HardwareProfile, measured: dict[str, Any]) -> HardwareProfile:
    """``base`` with measured host-link bandwidths and latency, the fitted overhead, and tables."""
    stamp = f"measured: kvsim calibrate on {measured['device']}, {measured['date']}"
    sources = dict(base.sources)
    tiers = list(base.tiers)
    h2d, d2h = measured["copy"]["h2d"], measured["copy"]["d2h"]
    for i, tier in enumerate(tiers):
        if tier.name == "dram":
            read, write = _asymptote(h2d), _asymptote(d2h)
            if tier.bandwidth_scope == "per_node":  # one GPU measured; the node has several
                read, write = read * base.gpus_per_node, write * base.gpus_per_node
            tiers[i] = dataclasses.replace(
                tier,
                read_bandwidth_bytes_per_s=read,
                write_bandwidth_bytes_per_s=write,
                latency_s=_latency(h2d, _asymptote(h2d)),
            )
            sources["tiers.dram.read_bandwidth"] = f"{stamp}: pinned host-to-device, largest copy"
            sources["tiers.dram.write_bandwidth"] = f"{stamp}: pinned device-to-host, largest copy"
            sources["tiers.dram.latency"] = f"{stamp}: smallest copy less its bytes at full rate"
    sources["efficiency.iteration_overhead_s"] = f"{stamp}: fitted from forward passes"
    return dataclasses.replace(
        base,
        name=name,
        description=f"{base.description}; calibrated on {measured['device']} ({measured['date']})",
        efficiency=dataclasses.replace(
            base.efficiency, iteration_overhead_s=measured["overhead_s"]
        ),
        tiers=tuple(tiers),
        sources=sources,
        source_path=None,
        measured=measured,
    )


def _size(n: int) -> str:
    return f"{int(n)}B"


def _rate(r: float) -> str:
    return f"{float(r)!r}B/s"


def _duration(s: float) -> str:
    return f"{float(s)!r}s"


def profile_toml(p: HardwareProfile) -> str:
    """The profile as TOML in the shipped files' layout, ``[measured]`` last."""
    head = {
        "name": p.name,
        "description": p.description,
        "gpus_per_node": p.gpus_per_node,
        "gpu_usd_per_hour": p.gpu_usd_per_hour,
        "gpu_memory_utilization": p.gpu_memory_utilization,
        "gpu": {
            "name": p.gpu.name,
            "hbm": _size(p.gpu.hbm_bytes),
            "hbm_bandwidth": _rate(p.gpu.hbm_bandwidth_bytes_per_s),
            "interconnect_bandwidth": _rate(p.gpu.interconnect_bandwidth_bytes_per_s),
            "host_link_bandwidth": _rate(p.gpu.host_link_bandwidth_bytes_per_s),
            "flops": dict(p.gpu.peak_flops_per_s),
        },
        "efficiency": {
            "compute": p.efficiency.compute,
            "memory": p.efficiency.memory,
            **(
                {"iteration_overhead_s": p.efficiency.iteration_overhead_s}
                if p.efficiency.iteration_overhead_s is not None
                else {}
            ),
        },
    }
    lines = [
        "# Written by `kvsim calibrate`; see docs/calibration.md. The [measured] tables drive the",
        "# cost model for the model, TP degree and dtype they name; the rest is the roofline.",
        dumps(head).rstrip(),
        "",
    ]
    for t in p.tiers:
        tier: dict[str, Any] = {
            "name": t.name,
            "capacity": _size(t.capacity_bytes),
            "read_bandwidth": _rate(t.read_bandwidth_bytes_per_s),
            "write_bandwidth": _rate(t.write_bandwidth_bytes_per_s),
            "bandwidth_scope": t.bandwidth_scope,
            "latency": _duration(t.latency_s),
            "usd_per_gb_hour": t.usd_per_gb_hour,
        }
        if t.shared_by_nodes != 1:
            tier["shared_by_nodes"] = t.shared_by_nodes
        tier["enabled"] = t.enabled
        if t.path is not None:
            tier["path"] = t.path
        if t.faster_than_above_note is not None:
            tier["faster_than_above_note"] = t.faster_than_above_note
        lines += ["[[tiers]]", dumps(tier).rstrip(), ""]
    lines += [dumps({"sources": p.sources}).rstrip(), ""]
    lines += [dumps({"measured": _finite(p.measured)}).rstrip()]
    return "\n".join(lines) + "\n"


def _finite(value: Any) -> Any:
    """NaN or inf would not validate; calibration never writes them, this makes sure."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("calibration produced a non-finite number")
    return value

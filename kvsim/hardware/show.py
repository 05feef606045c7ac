"""Plain-text views of profiles for `kvsim profile list` and `kvsim profile show`."""

from __future__ import annotations

import dataclasses

from kvsim.errors import KvsimError
from kvsim.hardware.profile import HardwareProfile, TierSpec
from kvsim.hardware.registry import load_profile, profile_names
from kvsim.hardware.validate import display_path

_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _si(value: float, unit: str) -> str:
    """Decimal units, as vendors quote them: 3.35e12, 'B/s' -> '3.35 TB/s'."""
    for scale, prefix in _SI_PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _duration(seconds: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def _table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def format_profile_list() -> str:
    """One line per known profile: name, GPU, GPUs per node, HBM per GPU, $/GPU-hour, tiers on."""
    rows = [["NAME", "GPU", "GPUS", "HBM/GPU", "$/GPU-H", "TIERS ON"]]
    for name in profile_names():
        try:
            p = load_profile(name)
        except KvsimError as exc:
            rows.append([name, f"INVALID: {exc}", "", "", "", ""])
            continue
        on = ",".join(t.name for t in p.enabled_tiers)
        rows.append([
            name, p.gpu.name, str(p.gpus_per_node), _si(p.gpu.hbm_bytes, "B"),
            f"{p.gpu_usd_per_hour:.2f}", on,
        ])  # fmt: skip
    return "\n".join(_table(rows))


def _tier_row(t: TierSpec) -> list[str]:
    return [
        t.name,
        "on" if t.enabled else "off",
        _si(t.capacity_bytes, "B"),
        _si(t.read_bandwidth_bytes_per_s, "B/s"),
        _si(t.write_bandwidth_bytes_per_s, "B/s"),
        "per GPU" if t.bandwidth_scope == "per_gpu" else "per node",
        _duration(t.latency_s),
        f"{t.usd_per_gb_hour:.3g}",
        str(t.shared_by_nodes),
        t.path or "-",
    ]


def _term(value: object) -> str:
    if isinstance(value, float) and 0 < value < 1e-2:
        return _duration(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _kernel_terms(p: HardwareProfile) -> list[str]:
    """[efficiency], [[allreduce]] and each engine's kernel terms, with their sources."""
    rows = [["TERM", "VALUE", "SOURCE"]]
    for f in dataclasses.fields(p.efficiency):
        value = getattr(p.efficiency, f.name)
        key = f"efficiency.{f.name}"
        if key in p.sources or f.name in ("compute", "memory"):
            rows.append([key, _term(value), p.sources.get(key, "")])
    for engine, kernels in sorted(p.engines.items()):
        for name, value in sorted(kernels.efficiency.items()):
            key = f"engines.{engine}.{name}"
            rows.append([key, _term(value), p.sources.get(key, "")])
    out = ["Kernel terms (kvsim.costmodel.kernels; an engine profile picks engines.NAME):"]
    out += [*_table(rows), ""]
    algorithms = [("", a) for a in p.allreduce]
    algorithms += [(f"engines.{e}.", a) for e, k in sorted(p.engines.items()) for a in k.allreduce]
    if algorithms:
        ar = [["ALL-REDUCE", "LATENCY", "PER GPU", "BUS BW", "MAX MESSAGE"]]
        for prefix, a in algorithms:
            limit = _si(a.max_bytes, "B") if a.max_bytes else "-"
            ar.append([f"{prefix}{a.name}", _duration(a.latency_s),
                       _duration(a.latency_per_gpu_s), _si(a.bus_bandwidth_bytes_per_s, "B/s"),
                       limit])  # fmt: skip
        out += [*_table(ar), ""]
    return out


def format_profile(profile: HardwareProfile) -> str:
    """Everything in a profile: GPU, efficiencies, tiers, and where each number came from."""
    p, g, src = profile, profile.gpu, profile.sources
    where = display_path(p.source_path) if p.source_path else "(built in code)"
    lines = [f"{p.name}: {p.description}", f"file: {where}", ""]

    node = [["FIELD", "VALUE", "SOURCE"]]
    values = [
        ("gpus_per_node", str(p.gpus_per_node)),
        ("gpu_usd_per_hour", f"${p.gpu_usd_per_hour:.2f}"),
        ("gpu_memory_utilization", f"{p.gpu_memory_utilization:g}"),
        ("gpu.hbm", _si(g.hbm_bytes, "B")),
        ("gpu.hbm_bandwidth", _si(g.hbm_bandwidth_bytes_per_s, "B/s")),
        *((f"gpu.flops.{d}", _si(f, "FLOP/s")) for d, f in g.peak_flops_per_s.items()),
        ("gpu.interconnect_bandwidth", _si(g.interconnect_bandwidth_bytes_per_s, "B/s")),
        ("gpu.host_link_bandwidth", _si(g.host_link_bandwidth_bytes_per_s, "B/s")),
    ]
    node += [[field, value, src.get(field, "")] for field, value in values]
    lines += [f"GPU: {g.name} × {p.gpus_per_node}", *_table(node), ""]
    lines += _kernel_terms(p)

    header = [
        "TIER",
        "ON",
        "CAPACITY",
        "READ",
        "WRITE",
        "SCOPE",
        "LATENCY",
        "$/GB-H",
        "SHARED",
        "PATH",
    ]
    lines += ["Tiers, fastest first (bandwidth of the path to/from HBM):"]
    lines += _table([header, *(_tier_row(t) for t in p.tiers)])
    lines += ["", "Sources of tier numbers:"]
    for t in p.tiers:
        lines += [f"  {k}: {v}" for k, v in src.items() if k.startswith(f"tiers.{t.name}.")]
        if t.faster_than_above_note:
            lines.append(
                f"  tiers.{t.name}: faster than the tier above: {t.faster_than_above_note}"
            )
    if p.measured:
        lines += ["", f"Measured tables: {', '.join(sorted(p.measured))}"]
    return "\n".join(lines)

"""Read a profile TOML into a HardwareProfile, or say in one line what is wrong and where.

Every error names the file and the dotted field (``tiers.nvme.read_bandwidth``) so a user can fix
it without reading kvsim's code; every number must say where it came from in ``[sources]``.
Calibration tables under ``[measured]`` carry their own provenance (device, driver, torch
version, date) instead of per-number sources; ``kvsim.hardware.measured_tables`` checks their shape.

Physical quantities (FLOP/s, sizes, bandwidths, counts, efficiencies) must be finite and above 0;
prices, latencies and the per-iteration overhead may be 0 (HBM is paid for in the GPU's price),
but no number may be NaN, infinite or negative: one such value used to pass and then make a run
"complete" 1 request of 100.

Every FLOP rate, memory size, bandwidth, capacity, latency and fixed overhead must also lie in a
plausible range (`PLAUSIBLE`, the one place the ranges and their reasons are written). The
ranges are datasheet orders of magnitude with a wide margin on both sides: they do not judge
hardware, they catch a unit slip. ``bf16 = 989.4`` (TFLOP/s typed without ``e12``) and
``bf16 = 1e-9`` used to pass; a run on such a profile then never ended, grew until MemoryError,
or reported a TTFT p50 of 3.2e12 s without a warning. `load_profile` validates every profile a
run, sweep or plan uses, so each of them refuses such a file in one line too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NoReturn

from kvsim.errors import ConfigError
from kvsim.hardware.durations import parse_duration
from kvsim.hardware.measured_tables import parse_measured
from kvsim.hardware.profile import (
    BANDWIDTH_SHARINGS,
    BLOCK_LAYOUTS,
    AllReduceAlgorithm,
    Efficiency,
    EngineKernels,
    GpuSpec,
    HardwareProfile,
    TierSpec,
)
from kvsim.hardware.tier_kinds import TIER_NAMES
from kvsim.textio import key_name, parse_toml, read_utf8
from kvsim.units import is_finite_number, parse_rate, parse_size

_TOP_FIELDS = {
    "name",
    "description",
    "gpus_per_node",
    "gpu_usd_per_hour",
    "gpu_memory_utilization",
    "gpu",
    "efficiency",
    "tiers",
    "sources",
    "measured",
    "allreduce",
    "engines",
}
_GPU_FIELDS = {
    "name",
    "hbm",
    "hbm_bandwidth",
    "flops",
    "interconnect_bandwidth",
    "host_link_bandwidth",
}
_EFFICIENCY_FIELDS = {"compute", "memory"}
#: Optional [efficiency] terms (kvsim.costmodel.kernels): fractions, exponents, seconds. The
#: CPU-side ones (iteration and request overheads) are the engine profile's (kvsim.engines);
#: a hardware profile gives them only where it measured them itself (kvsim calibrate).
_EFFICIENCY_FRACTIONS = ("attention", "elementwise", "decode_attention")
_EFFICIENCY_SECONDS = (
    "kernel_floor_s",
    "attention_floor_s",
    "elementwise_floor_s",
    "decode_attention_floor_s",
    "decode_attention_per_sequence_s",
    "iteration_overhead_s",
    "request_overhead_s",
)
_ALLREDUCE_FIELDS = {"name", "latency", "latency_per_gpu", "bus_bandwidth", "min_gpus", "max_bytes"}
_TIER_FIELDS = {
    "name",
    "capacity",
    "read_bandwidth",
    "write_bandwidth",
    "bandwidth_scope",
    "latency",
    "usd_per_gb_hour",
    "shared_by_nodes",
    "enabled",
    "path",
    "faster_than_above_note",
    "transfer_overhead",
    "block_layout",
    "bandwidth_sharing",
}
#: Most GPUs per node, or nodes sharing one tier, a profile may state: NVL72 racks have 72 GPUs
#: and a shared pool a few thousand nodes; a larger count is a typo and would overflow the
#: bandwidth arithmetic (a per-GPU bandwidth times the GPUs of a node).
MAX_COUNT = 1_000_000
#: Plausible ranges (low, high, unit) of a profile's physical quantities, in SI units, keyed by
#: kind. Each is a datasheet order of magnitude widened on both sides; a value outside is a unit
#: slip, not a device (see the reasons beside each).
PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    # Peak FLOP/s of one device, any dtype. Datasheets: an A100 312e12 (bf16 dense), an H100
    # 989e12, a GB200 5e15 (fp8) and 1e16 (fp4 dense); `kvsim calibrate --device cpu` writes a
    # CPU's best measured GEMM rate, ~1e9 to 1e12. The floor sits below any such CPU; TFLOP/s
    # typed without e12 (989.4) is 1e12 times too small, GFLOP/s (989400) 1e6 times.
    "flops": (1e8, 1e18, "FLOP/s"),
    # Memory of one device: GPUs carry 16 GB (T4) to 288 GB (B300, MI355X) of HBM; a CPU
    # calibration takes the machine's RAM (a few GB to a few TB). "80MB" for "80GB" is refused.
    "memory": (1e8, 1e14, "bytes"),
    # Bandwidths of one device: HBM (0.3e12 on a T4 to 8e12 on a B200), NVLink (0.3e12 to
    # 0.9e12 a direction), PCIe host links (16e9 to 64e9; Grace C2C 450e9) and all-reduce bus
    # rates. A CPU calibration's memory copy on a busy machine can be ~1e9, hence the floor.
    "device_bandwidth": (1e8, 1e15, "bytes/s"),
    # A tier's capacity, per GPU, node or shared pool: up to the largest parallel file systems
    # (Frontier's Orion holds 7e17 bytes). No floor: a tier too small for one KV block holds
    # nothing, which an experiment may want (the tests shrink dram to 4 KiB), and a size
    # without its unit is refused already.
    "capacity": (1.0, 1e20, "bytes"),
    # A tier's read or write bandwidth, per GPU or per node: from a disk or an object store
    # (~1e8) to a rack's HBM (72 GPUs x 8e12 = 6e14).
    "tier_bandwidth": (1e6, 1e16, "bytes/s"),
    # Latencies and fixed costs (a transfer's setup, an iteration's or a request's overhead, a
    # kernel's floor): HBM ~1e-7 s, a parallel file system ~5e-4 s, a serving front end ~1e-2
    # s. More than a second is seconds typed for micro- or milliseconds.
    "latency": (0.0, 1.0, "s"),
}
_SOURCE_PREFIX = re.compile(r"^(S\d+\b|assumption:|measured:|override:)")
_HAS_UNIT = re.compile(r"[A-Za-z]\s*$")


def _shown(value: object) -> str:
    """A value in an error message: its repr, cut to 60 characters (a line, not a page)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def display_path(path: Path) -> str:
    """The path as a user would type it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class _Reader:
    """Checks fields one by one, remembering which numeric fields need a source."""

    def __init__(self, path: Path) -> None:
        self.file = display_path(path)
        self.numeric_fields: list[str] = []

    def fail(self, field: str, message: str) -> NoReturn:
        raise ConfigError(f"{self.file}: {field}: {message}")

    def table(self, data: dict[str, Any], key: str, field: str) -> dict[str, Any]:
        value = self.required(data, key, field)
        if not isinstance(value, dict):
            self.fail(field, f"expected a table, got {_shown(value)}")
        return value

    def required(self, data: dict[str, Any], key: str, field: str) -> Any:
        if key not in data:
            self.fail(field, "missing required field")
        return data[key]

    def no_unknown(self, data: dict[str, Any], allowed: set[str], prefix: str) -> None:
        for key in data:
            if key not in allowed:
                expected = f"unknown field; expected one of {sorted(allowed)}"
                self.fail(f"{prefix}{key_name(key)}", expected)

    def text(self, data: dict[str, Any], key: str, field: str) -> str:
        value = self.required(data, key, field)
        if not isinstance(value, str) or not value.strip():
            self.fail(field, f"expected a non-empty string, got {_shown(value)}")
        return value

    def number(self, data: dict[str, Any], key: str, field: str, low: float = 0.0) -> float:
        """A finite number >= ``low`` (TOML's ``nan`` and ``inf``, and integers too long for a
        float, are refused)."""
        value = self.required(data, key, field)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
            self.fail(field, f"expected a number >= {low:g}, got {_shown(value)}")
        if not is_finite_number(value):
            self.fail(field, f"expected a finite number, got {_shown(value)}")
        self.numeric_fields.append(field)
        return float(value)

    def fraction(self, data: dict[str, Any], key: str, field: str) -> float:
        """A share in (0, 1]."""
        value = self.required(data, key, field)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            self.fail(field, f"expected a number in (0, 1], got {_shown(value)}")
        self.numeric_fields.append(field)
        return float(value)

    def count(self, data: dict[str, Any], key: str, field: str) -> int:
        """A positive integer up to ``MAX_COUNT`` (GPUs per node, nodes sharing a tier)."""
        value = self.required(data, key, field)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
            got = _shown(value)
            self.fail(field, f"expected a positive integer up to {MAX_COUNT:,}, got {got}")
        self.numeric_fields.append(field)
        return value

    def size(self, data: dict[str, Any], key: str, field: str) -> int:
        """A positive size written with its unit, e.g. '2TB'."""
        value = self.required(data, key, field)
        got = _shown(value)
        expected = f"expected a positive size with a unit such as '2TB' or '80GiB', got {got}"
        if not isinstance(value, str) or not _HAS_UNIT.search(value):
            self.fail(field, expected)
        try:
            size = parse_size(value, field)
        except ConfigError:
            self.fail(field, expected)
        if size <= 0:
            self.fail(field, expected)
        self.numeric_fields.append(field)
        return size

    def rate(self, data: dict[str, Any], key: str, field: str) -> float:
        """A positive bandwidth written with its unit, e.g. '12GB/s'."""
        value = self.required(data, key, field)
        expected = f"expected a positive bandwidth such as '12GB/s', got {_shown(value)}"
        if not isinstance(value, str) or not value.strip().endswith("/s"):
            self.fail(field, expected)
        if not _HAS_UNIT.search(value.strip().removesuffix("/s")):
            self.fail(field, expected)
        try:
            rate = parse_rate(value, field)
        except ConfigError:
            self.fail(field, expected)
        if rate <= 0:
            self.fail(field, expected)
        self.numeric_fields.append(field)
        return rate

    def plausible(self, field: str, value: float, kind: str) -> float:
        """``value`` if it lies in the ``PLAUSIBLE`` range of ``kind``; else the one-line error."""
        problem = implausible(kind, value)
        if problem:
            self.fail(field, problem)
        return value

    def duration(self, data: dict[str, Any], key: str, field: str) -> float:
        """A non-negative duration written with its unit, e.g. '3us'."""
        value = self.required(data, key, field)
        expected = f"expected a duration with a unit such as '3us' or '0.1ms', got {_shown(value)}"
        if not isinstance(value, str):
            self.fail(field, expected)
        try:
            seconds = parse_duration(value, field)
        except ConfigError:
            self.fail(field, expected)
        self.numeric_fields.append(field)
        return seconds


def implausible(kind: str, value: float) -> str | None:
    """Why ``value`` is out of the ``PLAUSIBLE`` range of ``kind``, or None when it is in it."""
    low, high, unit = PLAUSIBLE[kind]
    if low <= value <= high:
        return None
    hint = ""
    if kind == "flops":
        hint = "; write FLOP/s in full, e.g. bf16 = 989.4e12, not 989.4"
    elif kind == "latency":
        hint = "; check the unit (us, ms or s)"
    elif unit.startswith("bytes"):
        hint = "; check the unit (MB, GB, TB)"
    return (
        f"{value:.4g} {unit} is implausible: expected {low:g} to {high:g} {unit} "
        f"(datasheet orders of magnitude, kvsim.hardware.validate.PLAUSIBLE){hint}"
    )


def _read_toml(path: Path, reader: _Reader) -> dict[str, Any]:
    """The parsed file; a missing, unreadable or non-UTF-8 file is one ConfigError line."""
    try:
        missing = not path.exists() and not path.is_symlink()
    except (OSError, ValueError):  # a name too long to look up, or holding a NUL byte
        missing = True
    if missing:
        raise ConfigError(f"{reader.file}: no such profile file")
    return parse_toml(read_utf8(path, reader.file, ConfigError), reader.file, ConfigError)


def _gpu(r: _Reader, data: dict[str, Any]) -> GpuSpec:
    gpu = r.table(data, "gpu", "gpu")
    r.no_unknown(gpu, _GPU_FIELDS, "gpu.")
    flops_table = r.table(gpu, "flops", "gpu.flops")
    if not flops_table:
        r.fail("gpu.flops", "expected at least one dtype, e.g. bf16 = 989.4e12")
    flops = {}
    for dtype in flops_table:
        field = f"gpu.flops.{key_name(dtype)}"
        flops[dtype] = r.number(flops_table, dtype, field)
        if flops[dtype] <= 0:
            r.fail(
                field, f"expected a positive FLOP/s such as 989.4e12, got {flops_table[dtype]!r}"
            )
        r.plausible(field, flops[dtype], "flops")

    def bandwidth(key: str) -> float:
        return r.plausible(f"gpu.{key}", r.rate(gpu, key, f"gpu.{key}"), "device_bandwidth")

    return GpuSpec(
        name=r.text(gpu, "name", "gpu.name"),
        hbm_bytes=int(r.plausible("gpu.hbm", r.size(gpu, "hbm", "gpu.hbm"), "memory")),
        hbm_bandwidth_bytes_per_s=bandwidth("hbm_bandwidth"),
        peak_flops_per_s=flops,
        interconnect_bandwidth_bytes_per_s=bandwidth("interconnect_bandwidth"),
        host_link_bandwidth_bytes_per_s=bandwidth("host_link_bandwidth"),
    )


def _efficiency_terms(r: _Reader, eff: dict[str, Any], prefix: str) -> dict[str, float]:
    """The optional [efficiency] terms present in ``eff`` (a [efficiency] or [engines.NAME])."""
    terms: dict[str, float] = {}
    for key in _EFFICIENCY_FRACTIONS:
        if key in eff:
            terms[key] = r.fraction(eff, key, f"{prefix}{key}")
    for key in _EFFICIENCY_SECONDS:
        if key in eff:
            field = f"{prefix}{key}"
            terms[key] = r.plausible(field, r.number(eff, key, field), "latency")
    if "ridge_sharpness" in eff:
        # p of a p-norm: 1 adds the two limits, larger is sharper; below 1 is not a norm
        terms["ridge_sharpness"] = r.number(
            eff, "ridge_sharpness", f"{prefix}ridge_sharpness", low=1.0
        )
    if "attention_ramp_tokens" in eff:  # a chunk length: tokens, not seconds
        terms["attention_ramp_tokens"] = r.number(
            eff, "attention_ramp_tokens", f"{prefix}attention_ramp_tokens"
        )
    return terms


def _efficiency(r: _Reader, data: dict[str, Any]) -> Efficiency:
    eff = r.table(data, "efficiency", "efficiency")
    fields = {*_EFFICIENCY_FIELDS, *_EFFICIENCY_FRACTIONS, *_EFFICIENCY_SECONDS}
    fields |= {"ridge_sharpness", "attention_ramp_tokens"}
    r.no_unknown(eff, fields, "efficiency.")
    return Efficiency(
        compute=r.fraction(eff, "compute", "efficiency.compute"),
        memory=r.fraction(eff, "memory", "efficiency.memory"),
        **_efficiency_terms(r, eff, "efficiency."),
    )


def _engines(r: _Reader, data: dict[str, Any]) -> dict[str, EngineKernels]:
    """``[engines.NAME]``: the [efficiency] terms and all-reduce algorithms measured under one
    serving engine, which its engine profile picks by NAME."""
    raw = data.get("engines", {})
    if not isinstance(raw, dict):
        r.fail("engines", f"expected [engines.NAME] tables, got {_shown(raw)}")
    fields = {*_EFFICIENCY_FRACTIONS, *_EFFICIENCY_SECONDS, "compute", "memory"}
    fields |= {"ridge_sharpness", "attention_ramp_tokens", "allreduce"}
    engines: dict[str, EngineKernels] = {}
    for name, table in raw.items():
        prefix = f"engines.{key_name(name)}."
        if not isinstance(table, dict):
            r.fail(prefix.rstrip("."), f"expected a table, got {_shown(table)}")
        r.no_unknown(table, fields, prefix)
        terms = _efficiency_terms(r, table, prefix)
        for key in ("compute", "memory"):
            if key in table:
                terms[key] = r.fraction(table, key, prefix + key)
        allreduce = _allreduce(r, table.get("allreduce", []), prefix + "allreduce")
        engines[name] = EngineKernels(efficiency=terms, allreduce=allreduce)
    return engines


def _allreduce(r: _Reader, raw: Any, where: str = "allreduce") -> tuple[AllReduceAlgorithm, ...]:
    if not isinstance(raw, list):
        r.fail(where, f"expected [[{where}]] tables, one per algorithm")
    algorithms: list[AllReduceAlgorithm] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            r.fail(f"{where}[{index}]", f"expected an [[{where}]] table, got {_shown(item)}")
        name = r.text(item, "name", f"{where}[{index}].name")
        p = f"{where}.{name}."
        if any(a.name == name for a in algorithms):
            r.fail(p.rstrip("."), "duplicate algorithm; each name appears once")
        r.no_unknown(item, _ALLREDUCE_FIELDS, p)

        def latency(key: str, item: dict[str, Any] = item, p: str = p) -> float:
            return r.plausible(p + key, r.duration(item, key, p + key), "latency")

        bus = r.rate(item, "bus_bandwidth", p + "bus_bandwidth")
        algorithms.append(
            AllReduceAlgorithm(
                name=name,
                latency_s=latency("latency"),
                latency_per_gpu_s=latency("latency_per_gpu"),
                bus_bandwidth_bytes_per_s=r.plausible(p + "bus_bandwidth", bus, "device_bandwidth"),
                min_gpus=r.count(item, "min_gpus", p + "min_gpus") if "min_gpus" in item else 2,
                max_bytes=float(r.size(item, "max_bytes", p + "max_bytes"))
                if "max_bytes" in item
                else None,
            )
        )
    return tuple(algorithms)


def _tier(r: _Reader, index: int, raw: Any) -> TierSpec:
    if not isinstance(raw, dict):
        r.fail(f"tiers[{index}]", f"expected a [[tiers]] table, got {raw!r}")
    name = r.text(raw, "name", f"tiers[{index}].name")
    if name not in TIER_NAMES:
        r.fail(f"tiers[{index}].name", f"expected one of {list(TIER_NAMES)}, got {name!r}")
    p = f"tiers.{name}."
    r.no_unknown(raw, _TIER_FIELDS, p)
    scope = r.text(raw, "bandwidth_scope", p + "bandwidth_scope")
    if scope not in ("per_gpu", "per_node"):
        r.fail(p + "bandwidth_scope", f"expected 'per_gpu' or 'per_node', got {scope!r}")
    enabled = r.required(raw, "enabled", p + "enabled")
    if not isinstance(enabled, bool):
        r.fail(p + "enabled", f"expected true or false, got {enabled!r}")
    path = raw.get("path")
    if name == "nvme" and path not in ("gds", "bounce"):
        r.fail(p + "path", f"expected 'gds' or 'bounce', got {path!r}")
    if name != "nvme" and path is not None:
        r.fail(p + "path", "only the nvme tier has a path ('gds' or 'bounce')")
    shared = (
        r.count(raw, "shared_by_nodes", p + "shared_by_nodes") if "shared_by_nodes" in raw else 1
    )
    note = raw.get("faster_than_above_note")
    if note is not None and (not isinstance(note, str) or not note.strip()):
        r.fail(p + "faster_than_above_note", f"expected a non-empty string, got {note!r}")
    overhead = (
        r.plausible(
            p + "transfer_overhead",
            r.duration(raw, "transfer_overhead", p + "transfer_overhead"),
            "latency",
        )
        if "transfer_overhead" in raw
        else 0.0
    )
    layout = _choice(r, raw, "block_layout", p, BLOCK_LAYOUTS, "contiguous")
    sharing = _choice(r, raw, "bandwidth_sharing", p, BANDWIDTH_SHARINGS, "fixed")
    if sharing == "active" and (name in ("hbm", "rdma", "pfs") or scope != "per_node"):
        r.fail(
            p + "bandwidth_sharing",
            "'active' is for a node-local tier below hbm (dram, cxl, nvme) with "
            "bandwidth_scope = 'per_node'",
        )
    capacity = r.plausible(p + "capacity", r.size(raw, "capacity", p + "capacity"), "capacity")

    def bandwidth(key: str) -> float:
        return r.plausible(p + key, r.rate(raw, key, p + key), "tier_bandwidth")

    return TierSpec(
        name=name,
        capacity_bytes=int(capacity),
        read_bandwidth_bytes_per_s=bandwidth("read_bandwidth"),
        write_bandwidth_bytes_per_s=bandwidth("write_bandwidth"),
        bandwidth_scope=scope,  # type: ignore[arg-type]  # checked above
        latency_s=r.plausible(p + "latency", r.duration(raw, "latency", p + "latency"), "latency"),
        usd_per_gb_hour=r.number(raw, "usd_per_gb_hour", p + "usd_per_gb_hour"),
        shared_by_nodes=shared,
        enabled=enabled,
        path=path,
        faster_than_above_note=note,
        transfer_overhead_s=overhead,
        block_layout=layout,  # type: ignore[arg-type]  # checked by _choice
        bandwidth_sharing=sharing,  # type: ignore[arg-type]  # checked by _choice
    )


def _choice(
    r: _Reader, raw: dict[str, Any], key: str, prefix: str, valid: tuple[str, ...], default: str
) -> str:
    """An optional field that takes one of a few words."""
    value = raw.get(key, default)
    if value not in valid:
        r.fail(prefix + key, f"expected one of {list(valid)}, got {_shown(value)}")
    return value


def _tiers(r: _Reader, data: dict[str, Any], gpu: GpuSpec, gpus: int) -> tuple[TierSpec, ...]:
    raw = r.required(data, "tiers", "tiers")
    if not isinstance(raw, list) or not raw:
        r.fail("tiers", "expected one or more [[tiers]] tables, fastest first")
    tiers: list[TierSpec] = []
    for index, item in enumerate(raw):
        tier = _tier(r, index, item)
        field = f"tiers.{tier.name}"
        if any(t.name == tier.name for t in tiers):
            r.fail(field, "duplicate tier; each tier appears once")
        if tiers and TIER_NAMES.index(tier.name) < TIER_NAMES.index(tiers[-1].name):
            order = " > ".join(TIER_NAMES)
            r.fail(
                field,
                f"tiers out of order: expected fastest first ({order}), "
                f"but {tier.name!r} comes after {tiers[-1].name!r}",
            )
        if tiers and tier.faster_than_above_note is None:
            above = tiers[-1]
            if tier.node_read_bandwidth_bytes_per_s(gpus) > above.node_read_bandwidth_bytes_per_s(
                gpus
            ):
                r.fail(
                    f"{field}.read_bandwidth",
                    f"faster than the tier above ({above.name!r}) "
                    "per node; add faster_than_above_note saying why it sits lower",
                )
        tiers.append(tier)
    if tiers[0].name != "hbm":
        r.fail("tiers", f"expected the first tier to be 'hbm', got {tiers[0].name!r}")
    if tiers[0].capacity_bytes != gpus * gpu.hbm_bytes:
        r.fail(
            "tiers.hbm.capacity",
            f"expected gpus_per_node × gpu.hbm = {gpus * gpu.hbm_bytes} "
            f"bytes, got {tiers[0].capacity_bytes}",
        )
    if not tiers[0].enabled:
        r.fail("tiers.hbm.enabled", "the hbm tier is always enabled")
    return tuple(tiers)


def _sources(r: _Reader, data: dict[str, Any]) -> dict[str, str]:
    sources = r.table(data, "sources", "sources")
    for key, text in sources.items():
        if not isinstance(text, str) or not _SOURCE_PREFIX.match(text):
            r.fail(
                f"sources.{key_name(key)}",
                "expected text starting with a source id such as 'S1' "
                f"or with 'assumption:', got {text!r}",
            )
        if key not in r.numeric_fields:
            r.fail(f"sources.{key_name(key)}", "no such numeric field in this profile")
    for field in r.numeric_fields:
        if field not in sources:
            r.fail(field, f'no entry in [sources]; add "{field}" = "S<n> ..." or "assumption: ..."')
    return dict(sources)


def validate_profile(path: str | Path) -> HardwareProfile:
    """The profile in ``path``, or ConfigError naming the file and the first bad field."""
    path = Path(path)
    r = _Reader(path)
    data = _read_toml(path, r)
    r.no_unknown(data, _TOP_FIELDS, "")
    name = r.text(data, "name", "name")
    description = r.text(data, "description", "description")
    gpus = r.count(data, "gpus_per_node", "gpus_per_node")
    usd = r.number(data, "gpu_usd_per_hour", "gpu_usd_per_hour")
    utilization = r.fraction(data, "gpu_memory_utilization", "gpu_memory_utilization")
    gpu = _gpu(r, data)
    efficiency = _efficiency(r, data)
    allreduce = _allreduce(r, data.get("allreduce", []))
    engines = _engines(r, data)
    tiers = _tiers(r, data, gpu, gpus)
    sources = _sources(r, data)
    measured = data.get("measured", {})
    if not isinstance(measured, dict):
        r.fail("measured", f"expected a table, got {measured!r}")
    if measured:
        parse_measured(measured, r.fail)  # kept as read; the cost model parses it again
    return HardwareProfile(
        name=name,
        description=description,
        gpu=gpu,
        gpus_per_node=gpus,
        gpu_usd_per_hour=usd,
        gpu_memory_utilization=utilization,
        efficiency=efficiency,
        tiers=tiers,
        sources=sources,
        source_path=path,
        measured=measured,
        allreduce=allreduce,
        engines=engines,
    )

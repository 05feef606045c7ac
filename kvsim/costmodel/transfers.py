"""Seconds to move KV bytes between HBM and host DRAM or NVMe.

Kept beside the iteration cost models because it prices from the same calibration tables
(host copies and storage reads) and falls back the same way, to the tier's datasheet figures.
"""

from __future__ import annotations

from kvsim.costmodel.interpolate import RateCurve, Roofline, rate_curve
from kvsim.hardware.measured_tables import parse_measured, raise_config_error
from kvsim.hardware.profile import HardwareProfile


class TransferModel:
    """Seconds to move bytes between HBM and host DRAM or NVMe: measured curves where the profile
    has them, else latency + bytes / bandwidth of the tier (the roofline of a transfer)."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self.curves: dict[str, RateCurve] = {}
        tables = parse_measured(profile.measured, raise_config_error) if profile.measured else None
        names = {t.name for t in profile.tiers}
        if tables is not None:
            if "dram" in names:
                dram = profile.tier("dram")
                for direction, bw in (
                    ("h2d", dram.read_bandwidth_bytes_per_s),
                    ("d2h", dram.write_bandwidth_bytes_per_s),
                ):
                    if direction in tables.copies:
                        self.curves[direction] = rate_curve(
                            tables.copies[direction], _linear(dram.latency_s, bw)
                        )
            if tables.storage is not None and "nvme" in names:
                nvme = profile.tier("nvme")
                roof = _linear(nvme.latency_s, nvme.read_bandwidth_bytes_per_s)
                self.curves["nvme_read"] = rate_curve(tables.storage, roof)
        self.kind = "measured" if self.curves else "roofline"

    def time_s(self, tier: str, nbytes: float, write: bool = False) -> float:
        """One transfer of ``nbytes`` from ``tier`` into HBM (or out to it when ``write``)."""
        key = {"dram": "d2h" if write else "h2d", "nvme": None if write else "nvme_read"}.get(tier)
        if key in self.curves:
            return float(self.curves[key](max(nbytes, 1.0)))
        t = self.profile.tier(tier)
        bw = t.write_bandwidth_bytes_per_s if write else t.read_bandwidth_bytes_per_s
        return t.latency_s + nbytes / bw


def _linear(latency_s: float, bytes_per_s: float) -> Roofline:
    return lambda b: latency_s + b / bytes_per_s

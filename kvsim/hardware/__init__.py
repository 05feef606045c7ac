"""Hardware profiles: what a node's GPUs and KV-cache tiers can do, and each number's source.

The cost model (kvsim.costmodel) turns a profile into iteration times.
"""

from kvsim.hardware.durations import parse_duration
from kvsim.hardware.profile import (
    Efficiency,
    GpuSpec,
    HardwareProfile,
    TierSpec,
    with_overrides,
)
from kvsim.hardware.registry import load_profile, profile_names, profile_path, profiles_dir
from kvsim.hardware.tier_kinds import TIER_NAMES
from kvsim.hardware.validate import validate_profile

__all__ = [
    "TIER_NAMES",
    "Efficiency",
    "GpuSpec",
    "HardwareProfile",
    "TierSpec",
    "load_profile",
    "parse_duration",
    "profile_names",
    "profile_path",
    "profiles_dir",
    "validate_profile",
    "with_overrides",
]

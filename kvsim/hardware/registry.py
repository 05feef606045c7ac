"""Find profiles by name: hardware_profiles/*.toml stems, and measured/NAME for calibrated ones."""

from __future__ import annotations

import os
from pathlib import Path

import kvsim
from kvsim.errors import UnknownNameError
from kvsim.hardware.profile import HardwareProfile
from kvsim.hardware.validate import validate_profile
from kvsim.textio import exists

PROFILES_ENV = "KVSIM_PROFILES"
MEASURED_DIR = "measured"


def profiles_dir() -> Path:
    """The folder of shipped profiles, or the one named by $KVSIM_PROFILES."""
    override = os.environ.get(PROFILES_ENV)
    if override:
        return Path(override)
    return Path(kvsim.__file__).resolve().parents[1] / "hardware_profiles"


def profile_names() -> list[str]:
    """Every name ``load_profile`` accepts, calibrated ones as ``measured/NAME``."""
    root = profiles_dir()
    names = [p.stem for p in root.glob("*.toml")]
    names += [f"{MEASURED_DIR}/{p.stem}" for p in (root / MEASURED_DIR).glob("*.toml")]
    return sorted(names)


def profile_path(name: str) -> Path:
    """The file behind a profile name; UnknownNameError listing the valid names on a miss."""
    path = profiles_dir() / f"{name}.toml"
    if name not in profile_names() or not path.is_file():
        raise UnknownNameError("profile", name, profile_names())
    return path


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A validated profile from a name (``h100-sxm``, ``measured/h100-sxm``) or a TOML path."""
    text = str(name_or_path)
    if text.endswith(".toml") or (os.sep in text and exists(Path(text))):
        return validate_profile(Path(text))
    return validate_profile(profile_path(text))

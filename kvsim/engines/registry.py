"""Find engine profiles by name: ``vllm`` (its current version), ``vllm@0.6``, or a file path."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from kvsim.engines.profile import EngineProfile, parse_engine_profile
from kvsim.errors import ConfigError, UnknownNameError

PROFILES_DIR = Path(__file__).parent / "profiles"


@cache
def _shipped() -> dict[str, EngineProfile]:
    """Every shipped profile by ``name@version``; a file whose name disagrees is a bug."""
    out: dict[str, EngineProfile] = {}
    for path in sorted(PROFILES_DIR.glob("*.toml")):
        profile = parse_engine_profile(path)
        if path.stem != profile.full_name:
            raise ConfigError(f"{path}: name: the file should be {profile.full_name}.toml")
        out[profile.full_name] = profile
    return out


def engine_names() -> list[str]:
    """Every shipped ``name@version``, and each bare name (its current version)."""
    shipped = _shipped()
    return sorted({*shipped, *(p.name for p in shipped.values() if p.current)})


def load_engine(name: str | Path) -> EngineProfile:
    """The profile called ``name`` (``vllm``, ``vllm@0.24``) or in the TOML file ``name``."""
    text = str(name)
    if text.endswith(".toml") or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"engine profile {text}: no such file")
        return parse_engine_profile(path)
    shipped = _shipped()
    if text in shipped:
        return shipped[text]
    for profile in shipped.values():
        if profile.current and profile.name == text:
            return profile
    raise UnknownNameError("engine", text, engine_names())

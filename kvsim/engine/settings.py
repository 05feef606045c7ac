"""Configuration strings parsed once, at the edge, into typed settings the engine reads.

`EngineConfig` keeps what the user typed ('hbm=lru,dram=arc', 'dram=1TiB', ...), so a run's
config.toml reads like its command line; `resolve_settings` turns it into `TierSettings`, and
from there on nothing re-parses a string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvsim.engine.config import EngineConfig
from kvsim.errors import ConfigError, UnknownNameError
from kvsim.hardware.tier_kinds import TIER_NAMES
from kvsim.kvcache.hierarchy import ADMISSIONS
from kvsim.policies import parse_policy_params


@dataclass(frozen=True)
class TierSettings:
    """Per-tier choices: policy, its parameters, admission rule; which tiers, what capacity."""

    policies: dict[str, str]  # tier -> policy name
    policy_params: dict[str, dict[str, Any]]  # policy name -> its parameters
    admissions: dict[str, str]  # tier -> admission rule
    tiers: list[str] | None  # the tiers to enable (None: the profile's)
    capacities: dict[str, str] | None  # tier -> size text, per node (None: the profile's)
    named: dict[str, str]  # tier -> the option that named it (policy, admission)

    def params_of(self, tier: str) -> dict[str, Any] | None:
        return self.policy_params.get(self.policies[tier])

    def unused(self, enabled: list[str]) -> list[str]:
        """Settings for tiers the run does not use: they do nothing, and the user should know."""
        wanted = dict(self.named)
        wanted.update(dict.fromkeys(self.capacities or {}, "tier capacity"))
        return [
            f"{option} {tier}: tier {tier} is not enabled (enabled: {', '.join(enabled)}), so "
            f"this setting does nothing; add it with --tiers {','.join([*enabled, tier])}"
            for tier, option in wanted.items()
            if tier not in enabled
        ]


def per_tier(text: str, option: str, default: str) -> dict[str, str]:
    """'lru' -> every tier 'lru'; 'hbm=lru,dram=arc' -> those tiers, `default` for the rest."""
    text = text.strip()
    if "=" not in text:
        return dict.fromkeys(TIER_NAMES, text or default)
    out = dict.fromkeys(TIER_NAMES, default)
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not value:
            raise ConfigError(f"{option}: expected NAME=VALUE pairs, got {part!r}")
        if name not in TIER_NAMES:
            raise UnknownNameError("tier", name, list(TIER_NAMES))
        out[name] = value
    return out


def _named(text: str, option: str) -> dict[str, str]:
    """The tiers a per-tier string names explicitly ('hbm=lru,nvme=arc' -> hbm, nvme)."""
    if "=" not in text:
        return {}
    return {part.partition("=")[0].strip(): option for part in text.split(",")}


def _tier_list(text: str | None) -> list[str] | None:
    if not text:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    return list(TIER_NAMES) if names == ["all"] else names


def _capacities(text: str) -> dict[str, str] | None:
    if not text.strip():
        return None
    capacities = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        if not sep:
            raise ConfigError(f"tier capacity: expected NAME=SIZE, got {part!r}")
        if name.strip() == "hbm":
            raise ConfigError(
                "tier capacity hbm: HBM for KV follows from the GPU and the model; "
                "use --num-gpu-blocks to set it"
            )
        capacities[name.strip()] = size.strip()
    return capacities


def resolve_settings(config: EngineConfig) -> TierSettings:
    """Parse and check every per-tier string of `config`."""
    admissions = per_tier(config.admission, "admission", "all")
    for name, rule in admissions.items():
        if rule not in ADMISSIONS:
            raise ConfigError(f"admission {name}={rule}: expected one of {', '.join(ADMISSIONS)}")
    return TierSettings(
        policies=per_tier(config.policy, "policy", "lru"),
        policy_params=parse_policy_params(config.policy_params),
        admissions=admissions,
        tiers=_tier_list(config.tiers),
        capacities=_capacities(config.tier_capacity),
        named={**_named(config.policy, "policy"), **_named(config.admission, "admission")},
    )

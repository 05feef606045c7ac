"""Every engine setting parsed and checked once, into the typed values a run is built from.

`EngineConfig` keeps what the user typed ('hbm=lru,dram=arc', 'quant:k=4,v=4', 'dynamo-kv'),
so a run's config.toml reads like its command line. `resolve_engine` is the one place that
reads those strings and the only validator of engine settings: the CLI, `kvsim.run`, sweeps and
plans call it (a check is a resolve whose result is dropped), and everything downstream takes
the `ResolvedEngine`, never a string. Unknown names fail here, before any trace is read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kvsim.capacity import profile_capacity_report
from kvsim.compression import Compression, parse_compression
from kvsim.engine.compress import page_bytes
from kvsim.engine.config import EngineConfig
from kvsim.engine.settings import TierSettings, resolve_settings
from kvsim.engine.tiers import node_of, resolve_profile
from kvsim.engines import EngineProfile, load_engine
from kvsim.errors import ConfigError, KvsimError
from kvsim.hardware.profile import HardwareProfile
from kvsim.kvcache.overlap import LOAD_OVERLAPS
from kvsim.models import ModelSpec, kv_bytes_per_block
from kvsim.policies import make_policy
from kvsim.routers import check_router_params, parse_router_params, resolve_router

#: The most GPUs one run may model: more than the largest fleets serve one model with.
MAX_GPUS = 100_000
#: The shortest router refresh interval: far below one iteration (milliseconds), a snapshot is
#: the live state, so 0 (exact state) says it and costs no refresh events.
MIN_ROUTER_REFRESH_S = 1e-3
#: A KV pool larger than this many times the GPUs' HBM is a typo, not a what-if.
MAX_HBM_OVERSUBSCRIPTION = 100
#: The largest integer a results table or config file holds.
MAX_INT = 2**63 - 1

_CHOICES: dict[str, tuple[str, ...]] = {
    "write_policy": ("write-back", "write-through"),
    "hierarchy": ("inclusive", "exclusive"),
    "load_overlap": LOAD_OVERLAPS,
    "kv_reservation": ("prompt", "full"),
}


@dataclass(frozen=True)
class ResolvedEngine:
    """An engine config with every string parsed, every name found and every size computed."""

    config: EngineConfig  # as given, with the engine profile's defaults for what was left unset
    engine: EngineProfile
    model: ModelSpec
    profile: HardwareProfile  # the run's tiers enabled, capacity overrides applied
    tiers: TierSettings
    compression: Compression  # the parsed profile; `auto` holds its candidates
    router_params: dict[str, Any] | None  # the run's router's parameters
    pd_split: tuple[int, int] | None
    roles: tuple[str, ...]  # per replica: mixed, or prefill / decode under P/D
    num_blocks: int  # KV blocks per replica
    block_bytes: int  # bytes of one block (page) on one rank
    warnings: tuple[str, ...]  # settings that do nothing in this run

    @property
    def replica_count(self) -> int:
        return len(self.roles)


def resolve_engine(
    config: EngineConfig, model: ModelSpec, profile: HardwareProfile
) -> ResolvedEngine:
    """Parse and check `config` for `model` on `profile` (one ConfigError line if it cannot run)."""
    check_fields(config)
    engine = engine_profile(config)
    config = with_engine_defaults(config, engine)
    tiers = resolve_settings(config)
    _check_policies(tiers)
    resolved_profile = resolve_profile(profile, tiers)
    enabled = [t.name for t in resolved_profile.tiers if t.enabled]
    comp = parse_compression(config.compression)
    split = pd_split(config)
    if not comp.identity and split is not None:
        raise ConfigError(
            "engine.compression: prefill/decode disaggregation moves uncompressed prompts; "
            "compression with --pd is not modelled"
        )
    router_params, router_warnings = _router_params(config)
    count = sum(split) if split is not None else (config.replicas or 1)
    if count * config.tp > MAX_GPUS:  # before the roles: a tuple of 2^32 of them is a MemoryError
        raise ConfigError(
            f"engine.replicas: {count:,} replicas of {config.tp} GPU{'s' * (config.tp > 1)} "
            f"need {count * config.tp:,} GPUs; kvsim models at most {MAX_GPUS:,}"
        )
    roles = _roles(config, split)
    _check_pd_network(config, resolved_profile, roles)
    num_blocks, block_bytes = _kv_blocks(config, model, resolved_profile, comp)
    return ResolvedEngine(
        config=config,
        engine=engine,
        model=model,
        profile=resolved_profile,
        tiers=tiers,
        compression=comp,
        router_params=router_params,
        pd_split=split,
        roles=roles,
        num_blocks=num_blocks,
        block_bytes=block_bytes,
        warnings=(*tiers.unused(enabled), *router_warnings),
    )


def engine_profile(config: EngineConfig) -> EngineProfile:
    """The engine profile `config.engine` names (one ConfigError line naming the setting)."""
    if not isinstance(config.engine, str) or not config.engine.strip():
        raise ConfigError(
            f"engine.engine: expected an engine profile such as vllm or sglang@0.5, "
            f"got {config.engine!r}"
        )
    try:
        return load_engine(config.engine)
    except KvsimError as exc:
        raise ConfigError(f"engine.engine: {exc}") from None


def with_engine_defaults(config: EngineConfig, engine: EngineProfile) -> EngineConfig:
    """`config` with each scheduler setting left unset taken from the engine profile."""
    unset = {k: v for k, v in engine.defaults.items() if getattr(config, k) is None}
    return dataclasses.replace(config, **unset) if unset else config


def check_fields(config: EngineConfig) -> None:
    """Each setting on its own: its type, its range, one of its choices."""
    for name in ("block_size", "tp"):
        _positive_int(config, name)
    for name in ("max_num_seqs", "max_num_batched_tokens", "num_scheduler_steps"):
        if getattr(config, name) is not None:  # None: the engine profile's default
            _positive_int(config, name)
    if config.mixed_batches not in (None, True, False):
        raise ConfigError(
            f"engine.mixed_batches: expected true or false, got {config.mixed_batches!r}"
        )
    if config.chunked_prefill not in (None, True, False):
        raise ConfigError(
            f"engine.chunked_prefill: expected true or false, got {config.chunked_prefill!r}"
        )
    if config.num_gpu_blocks is not None:
        _positive_int(config, "num_gpu_blocks")
    for name, valid in _CHOICES.items():
        value = getattr(config, name)
        if value is None and name == "kv_reservation":
            continue
        if value not in valid:
            raise ConfigError(f"engine.{name}: expected one of {', '.join(valid)}, got {value!r}")
    if config.write_policy == "write-through" and config.hierarchy == "exclusive":
        raise ConfigError(
            "engine.write_policy: write-through keeps a copy below every HBM block, "
            "so it needs hierarchy = 'inclusive'"
        )
    if config.replicas is not None:
        _positive_int(config, "replicas")
    if config.pd_threshold is not None and not _int_in(config.pd_threshold, 0, MAX_INT):
        raise ConfigError(
            "engine.pd_threshold: expected a non-negative token count below 2^63, "
            f"got {config.pd_threshold!r}"
        )
    for name, what in (("router", "a router name"), ("policy", "a policy name (e.g. lru) or "
                       "one per tier (hbm=lru,dram=arc)"), ("compression", "a profile such as "
                       "none or quant:k=4,v=4")):  # fmt: skip
        value = getattr(config, name)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"engine.{name}: expected {what}, got {value!r}")
    if not _int_in(config.seed, 0, MAX_INT):
        raise ConfigError(f"engine.seed: expected a non-negative integer, got {config.seed!r}")
    _check_times(config)


def _check_times(config: EngineConfig) -> None:
    if not _finite(config.auto_latency_budget_s) or not config.auto_latency_budget_s > 0:
        raise ConfigError(
            "engine.auto_latency_budget_s: expected a positive number of seconds, "
            f"got {config.auto_latency_budget_s!r}"
        )
    if not _finite(config.auto_memory_fraction) or not 0 < config.auto_memory_fraction <= 1:
        raise ConfigError(
            "engine.auto_memory_fraction: expected a share in (0, 1], "
            f"got {config.auto_memory_fraction!r}"
        )
    for name in ("prefetch_lead_s", "timeline_interval_s", "router_refresh_s"):
        value = getattr(config, name)
        if not _finite(value) or not value >= 0:
            raise ConfigError(f"engine.{name}: expected a non-negative number, got {value!r}")
    if config.timeline_interval_s <= 0:
        raise ConfigError("engine.timeline_interval_s: expected a positive number of seconds")
    if 0 < config.router_refresh_s < MIN_ROUTER_REFRESH_S:
        raise ConfigError(
            f"engine.router_refresh_s: {config.router_refresh_s:g} s is far below one "
            f"iteration, where a snapshot is the live state; give 0 (exact state) or at least "
            f"{MIN_ROUTER_REFRESH_S:g} s"
        )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _positive_int(config: EngineConfig, name: str) -> None:
    value = getattr(config, name)
    if not _int_in(value, 1, MAX_INT):
        raise ConfigError(f"engine.{name}: expected a positive integer, got {value!r}")


def _check_policies(tiers: TierSettings) -> None:
    """Every named policy exists and takes its parameters; no parameter for an unused one."""
    used = sorted(set(tiers.policies.values()))
    for name, params in tiers.policy_params.items():
        if name not in used:
            raise ConfigError(
                f"policy parameter {name}.{next(iter(params))}: policy {name!r} is not used in "
                f"this run (policies: {', '.join(used)})"
            )
    for name in used:
        make_policy(name, tiers.policy_params.get(name))


def _router_params(config: EngineConfig) -> tuple[dict[str, Any] | None, list[str]]:
    """The run's router's parameters, each router named in them checked against its own
    parameters; a warning for those of a router the run does not use."""
    resolve_router(config.router)
    by_router = parse_router_params(config.router_params)
    warnings = []
    for name, params in by_router.items():
        check_router_params(name, params)
        if name != config.router:
            warnings.append(
                f"router parameter {name}.{next(iter(params))}: router {name!r} is not used in "
                f"this run (router: {config.router}), so this setting does nothing"
            )
    return by_router.get(config.router), warnings


def pd_split(config: EngineConfig) -> tuple[int, int] | None:
    """(prefill, decode) replicas from 'P:D', or None for aggregated serving."""
    if not config.pd:
        return None
    p, sep, d = config.pd.partition(":")
    if not (sep and p.strip().isdigit() and d.strip().isdigit()):
        raise ConfigError(f"engine.pd: expected P:D such as 1:3, got {config.pd!r}")
    split = int(p), int(d)
    if min(split) < 1:
        raise ConfigError(f"engine.pd: {config.pd!r} needs at least one prefill and one decode")
    return split


def _roles(config: EngineConfig, split: tuple[int, int] | None) -> tuple[str, ...]:
    if split is None:
        return ("mixed",) * (config.replicas or 1)
    if config.replicas is not None and config.replicas != sum(split):
        raise ConfigError(
            f"engine.replicas: {config.replicas} disagrees with pd {config.pd!r} "
            f"({sum(split)} replicas); give one or the other"
        )
    return ("prefill",) * split[0] + ("decode",) * split[1]


def _check_pd_network(
    config: EngineConfig, profile: HardwareProfile, roles: tuple[str, ...]
) -> None:
    """P/D across nodes moves prompts over the fabric, whose bandwidth the rdma tier gives."""
    if "prefill" not in roles or any(t.name == "rdma" for t in profile.tiers):
        return
    if len({node_of(i, config.tp, profile.gpus_per_node) for i in range(len(roles))}) > 1:
        raise ConfigError(
            "pd: prefill and decode replicas span nodes, but the hardware profile has no "
            "rdma tier to give the network between them a bandwidth"
        )


def _kv_blocks(
    config: EngineConfig, model: ModelSpec, profile: HardwareProfile, comp: Compression
) -> tuple[int, int]:
    """(KV blocks per replica, bytes of one page on one rank): from HBM left after weights, or
    `num_gpu_blocks`. A compression makes pages smaller; under auto a page holds the least
    compressed candidate's tokens."""
    bs, dtype, tp = config.block_size, config.kv_dtype, config.tp
    if comp.identity:
        block_bytes = kv_bytes_per_block(model, bs, dtype, tp)
    else:
        candidates = comp.candidates if comp.per_request_choice else (comp,)
        block_bytes = max(page_bytes(model, c, bs, dtype, tp) for c in candidates)
    hbm_bytes = profile.gpu.hbm_bytes
    if config.num_gpu_blocks is not None:
        if config.num_gpu_blocks * block_bytes > MAX_HBM_OVERSUBSCRIPTION * hbm_bytes:
            raise ConfigError(
                f"engine.num_gpu_blocks: {config.num_gpu_blocks:,} blocks of {block_bytes:,} "
                f"bytes are more than {MAX_HBM_OVERSUBSCRIPTION}x the HBM of one "
                f"{profile.name} GPU ({hbm_bytes / 2**30:,.0f} GiB)"
            )
        return config.num_gpu_blocks, block_bytes
    report = profile_capacity_report(
        model,
        profile,
        tp=tp,
        kv_dtype=dtype,
        weight_dtype=config.weight_dtype,
        block_size=bs,
    )
    blocks = int(report["kv_capacity_bytes_per_rank"] // block_bytes)
    if blocks < 1:
        raise KvsimError(f"{model.name} at tp={tp} leaves no HBM for KV blocks on {profile.name}")
    return blocks, block_bytes

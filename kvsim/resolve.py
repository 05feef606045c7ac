"""A run's configuration parsed and checked once: the one validator of run settings.

`resolve(config)` finds every name the run will look up (trace, model, hardware profile,
policies, router, compression profile), checks every number against its range, resolves the
weight dtype and the default run length, and returns a frozen `ResolvedRun` that the rest of a
run takes instead of strings. The CLI, `kvsim.run`, sweeps and plans call it; a check is a
resolve whose result is dropped. Nothing here reads a trace, so a typo fails in milliseconds.

Limits on inputs that scale a run's time or memory are constants here and in
kvsim.engine.resolve, listed in the README's reliability notes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from kvsim.config import RunConfig
from kvsim.engine.config import EngineConfig
from kvsim.engine.resolve import ResolvedEngine, resolve_engine
from kvsim.engines.registry import PROFILES_DIR
from kvsim.errors import ConfigError, UnknownNameError
from kvsim.hardware import load_profile
from kvsim.hardware.profile import HardwareProfile
from kvsim.metrics import Slo
from kvsim.models import ModelSpec, load_model
from kvsim.models.dtypes import weight_dtype_bytes
from kvsim.textio import exists
from kvsim.traces.arrivals import check_arrival
from kvsim.traces.registry import run_requests, trace_names

#: The most requests one run replays: a day of a large fleet's traffic is 10-40 M.
MAX_REQUESTS = 100_000_000
#: The highest arrival rate (sessions/s) and rate multiplier: far above any fleet's traffic.
MAX_RATE = 1e6


@dataclass(frozen=True)
class ResolvedRun:
    """A `RunConfig` with the run's choices filled in and every setting checked.

    `config` is the config as the run uses it: the weight dtype, the compression's canonical
    label and the default run length filled in; it is what the results folder records."""

    config: RunConfig
    model: ModelSpec
    profile: HardwareProfile  # as loaded; `engine.profile` has the run's tiers applied
    engine: ResolvedEngine
    slo: Slo


def resolve(config: RunConfig) -> ResolvedRun:
    """Check `config` and resolve it (one KvsimError line naming the setting if it cannot run)."""
    _check_workload(config)
    model = load_model(config.model)
    profile = load_profile(config.hardware)
    weight_dtype = resolve_weight_dtype(config, model.weight_dtype)
    weight_dtype_bytes(weight_dtype)  # an unknown dtype fails here, listing the valid ones
    engine_config = dataclasses.replace(config.engine, weight_dtype=weight_dtype)
    engine = resolve_engine(engine_config, model, profile)
    # as the run used it: the engine's defaults filled in, the engine and compression by full name
    named = engine.engine.source_path is None or engine.engine.source_path.parent == PROFILES_DIR
    engine_config = dataclasses.replace(
        engine.config,
        compression=engine.compression.label,
        engine=engine.engine.full_name if named else engine.config.engine,
    )
    engine = dataclasses.replace(engine, config=engine_config)
    max_requests = config.max_requests
    if max_requests is None:
        max_requests = run_requests(config.trace)
    resolved = dataclasses.replace(
        config, weight_dtype=weight_dtype, engine=engine_config, max_requests=max_requests
    )
    return ResolvedRun(resolved, model, profile, engine, Slo(config.slo_ttft_s, config.slo_tpot_s))


def resolve_weight_dtype(config: RunConfig, native: str) -> str:
    """The weight dtype a run uses: the config's, else a non-default engine one, else `native`."""
    if config.weight_dtype is not None:
        return config.weight_dtype
    default = EngineConfig.__dataclass_fields__["weight_dtype"].default
    return config.engine.weight_dtype if config.engine.weight_dtype != default else native


def _check_workload(config: RunConfig) -> None:
    """The trace exists; counts, rates and objectives are positive and within bounds."""
    n = config.max_requests
    if n is not None and (
        not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_REQUESTS
    ):
        raise ConfigError(
            f"max_requests: expected a positive integer up to {MAX_REQUESTS:,}, got {n!r}"
        )
    for key, high in (("rate", MAX_RATE), ("rate_scale", MAX_RATE), ("cv", None)):
        _positive(key, getattr(config, key), high)
    for key in ("slo_ttft_s", "slo_tpot_s"):
        _positive(key, getattr(config, key), None)
    check_arrival(config.arrival, config.cv)
    trace = config.trace
    if not isinstance(trace, str) or not trace.strip():
        raise UnknownNameError("trace", str(trace), [*trace_names(), "a file path"])
    if trace not in trace_names() and not exists(Path(trace)):  # a name too long is missing
        raise UnknownNameError("trace", trace, [*trace_names(), "a file path"])


def _positive(key: str, value: object, high: float | None) -> None:
    if value is None:
        return
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{key}: expected a positive number, got {value!r}")
    if high is not None and value > high:
        raise ConfigError(f"{key}: {value:g} is above the largest kvsim accepts ({high:g})")

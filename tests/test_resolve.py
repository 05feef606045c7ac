"""One resolution of a run's settings: each string parsed once, unknown names and impossible
values refused before any trace is read, limits on what scales a run's time and memory."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

import kvsim.compression.profiles
import kvsim.engine.resolve
import kvsim.engine.settings
import kvsim.policies
import kvsim.routers
import kvsim.traces.registry
from kvsim.config import RunConfig
from kvsim.engine import EngineConfig
from kvsim.errors import ConfigError, KvsimError, UnknownNameError
from kvsim.resolve import resolve
from kvsim.run import run

# every parser of a string setting, by where it is defined
PARSERS = {
    "compression": (kvsim.compression.profiles, "parse_compression"),
    "policy_params": (kvsim.policies, "parse_policy_params"),
    "router_params": (kvsim.routers, "parse_router_params"),
    "per_tier": (kvsim.engine.settings, "per_tier"),
    "tier_capacity": (kvsim.engine.settings, "_capacities"),
    "tiers": (kvsim.engine.settings, "_tier_list"),
    "pd": (kvsim.engine.resolve, "pd_split"),
}


@pytest.fixture
def parse_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts calls of every parser, wherever a module imported it from."""
    calls: Counter[str] = Counter()

    def counting(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for name, (module, attr) in PARSERS.items():
        original = getattr(module, attr)
        wrapped = counting(name, original)
        for mod in list(sys.modules.values()):
            if mod is not None and mod.__name__.startswith("kvsim"):
                for key, value in list(vars(mod).items()):
                    if value is original:
                        monkeypatch.setattr(mod, key, wrapped)
    yield calls


def test_each_string_setting_is_parsed_once_per_run(parse_calls: Counter[str]) -> None:
    engine = EngineConfig(
        policy="hbm=lru-k,dram=arc",
        policy_params="lru-k.k=2",
        admission="dram=second-chance",
        tiers="hbm,dram",
        tier_capacity="dram=64GiB",
        router="llm-d",
        router_params="llm-d.prefix_weight=2",
        replicas=2,
        compression="quant:k=4,v=4",
    )
    outcome = run(RunConfig(trace="sharegpt", max_requests=40, engine=engine))
    assert outcome.summary["completed"] == 40
    # per_tier reads policy and admission: one call each
    assert parse_calls == {
        "compression": 1,
        "policy_params": 1,
        "router_params": 1,
        "per_tier": 2,
        "tier_capacity": 1,
        "tiers": 1,
        "pd": 1,
    }


def test_unknown_names_are_refused_before_any_trace_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_reading(*args, **kwargs):
        raise AssertionError("a trace was read before the settings were checked")

    monkeypatch.setattr(kvsim.traces.registry, "load_trace", no_reading)
    monkeypatch.setattr("kvsim.run.load_trace", no_reading)
    bad = {
        "router": EngineConfig(router="nope"),
        "policy": EngineConfig(policy="dram=nope"),
        "compression": EngineConfig(compression="zip"),
        "tier": EngineConfig(tiers="hbm,ssd"),
    }
    for kind, engine in bad.items():
        with pytest.raises(UnknownNameError, match=f"unknown {kind}"):
            run(RunConfig(max_requests=5, engine=engine))
    for field, value in (("model", "gpt-9"), ("hardware", "tpu-v9"), ("trace", "nope")):
        with pytest.raises(KvsimError, match="unknown"):
            run(dataclasses.replace(RunConfig(max_requests=5), **{field: value}))


@pytest.mark.parametrize(
    ("engine", "needle"),
    [
        (EngineConfig(replicas=20_000, tp=8), "kvsim models at most 100,000"),
        (EngineConfig(replicas=2, router_refresh_s=1e-9), "give 0 (exact state) or at least"),
        (EngineConfig(router_refresh_s=float("inf")), "expected a non-negative number"),
        (EngineConfig(num_gpu_blocks=10**9), "more than 100x the HBM"),
        (EngineConfig(pd="2:2", pd_threshold=2**63), "below 2^63"),
        (EngineConfig(pd="2:2", replicas=1), "disagrees with pd"),
        (EngineConfig(seed=-1), "engine.seed"),
        (EngineConfig(compression="quant", pd="1:1"), "not modelled"),
        (EngineConfig(policy_params="lru-k.k=2"), "'lru-k' is not used"),
    ],
)
def test_impossible_settings_are_one_config_error(engine: EngineConfig, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)) as info:
        resolve(RunConfig(max_requests=5, engine=engine))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"max_requests": 10**9}, "up to 100,000,000"),
        ({"max_requests": 0}, "max_requests: expected a positive integer"),
        ({"rate": 1e9}, "above the largest"),
        ({"rate_scale": float("nan")}, "rate_scale: expected a positive number"),
        ({"slo_ttft_s": 0.0}, "slo_ttft_s: expected a positive number"),
    ],
)
def test_workload_bounds(changes: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        resolve(dataclasses.replace(RunConfig(), **changes))


def test_resolved_run_fills_in_the_runs_choices() -> None:
    resolved = resolve(RunConfig(trace="mooncake-conversation", engine=EngineConfig(pd="1:2")))
    assert resolved.config.max_requests == 1000  # the trace's default run length
    assert resolved.config.weight_dtype == "bf16"  # the model's native dtype
    assert resolved.engine.roles == ("prefill", "decode", "decode")
    assert resolved.engine.replica_count == 3 and resolved.engine.num_blocks > 0
    quant = resolve(RunConfig(engine=EngineConfig(compression="quant")))
    assert quant.config.engine.compression == quant.engine.compression.label != "quant"


def test_a_parameter_of_a_router_not_in_use_is_checked_and_reported() -> None:
    with pytest.raises(ConfigError, match="router 'llm-d': unknown parameter 'x'"):
        resolve(RunConfig(engine=EngineConfig(router_params="llm-d.x=1")))
    resolved = resolve(RunConfig(engine=EngineConfig(router_params="llm-d.prefix_weight=2")))
    assert any("router 'llm-d' is not used" in w for w in resolved.engine.warnings)


def test_pd_across_nodes_needs_a_fabric() -> None:
    from kvsim.engine.resolve import resolve_engine
    from kvsim.hardware import load_profile
    from kvsim.models import load_model

    model, profile = load_model("llama-3.1-8b"), load_profile("h100-sxm")
    alone = dataclasses.replace(profile, tiers=tuple(t for t in profile.tiers if t.name != "rdma"))
    assert resolve_engine(EngineConfig(pd="4:4"), model, alone).roles.count("decode") == 4
    with pytest.raises(ConfigError, match="span nodes"):  # 16 GPUs: two nodes of 8
        resolve_engine(EngineConfig(pd="8:8"), model, alone)
    assert resolve_engine(EngineConfig(pd="8:8"), model, profile).replica_count == 16

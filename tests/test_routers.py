"""Routers: each one's choice on hand-built cluster states equals its formula (worked numbers in
the comments), plus the registry, parameters, plugins and seeded determinism."""

from __future__ import annotations

import dataclasses
import random
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest

import kvsim.plugins as plugins
from kvsim.errors import ConfigError, KvsimError, PluginError, UnknownNameError
from kvsim.routers import (
    GuardedRouter,
    PrefixMatch,
    ReplicaLoad,
    Router,
    RouteRequest,
    builtin_router_names,
    make_router,
    parse_router_params,
    register,
    resolve_router,
    router_names,
)
from kvsim.routers.dynamo_kv import DynamoKv
from kvsim.routers.llm_d import LlmD
from kvsim.routers.min_ttft import MinTtft
from kvsim.routers.prefix_index import BlockIndex
from kvsim.routers.production_stack import ProductionStack
from kvsim.routers.round_robin import RoundRobin
from kvsim.routers.sglang_cache_aware import SglangCacheAware

BS = 16


def load(
    index: int,
    waiting: int = 0,
    running: int = 0,
    prefill_tokens: int = 0,
    decode_blocks: int = 0,
    kv_usage: float = 0.0,
) -> ReplicaLoad:
    return ReplicaLoad(
        index=index,
        node=0,
        role="mixed",
        waiting=waiting,
        running=running,
        prefill_tokens=prefill_tokens,
        decode_blocks=decode_blocks,
        kv_usage=kv_usage,
        capacity_blocks=1000,
    )


def req(
    tokens: int = 160, first_hash: int = 1000, session: int = 0, hashes: Sequence[int] | None = None
) -> RouteRequest:
    """A request whose full blocks hash to first_hash, first_hash + 1, ..."""
    if hashes is None:
        hashes = list(range(first_hash, first_hash + tokens // BS))
    return RouteRequest(
        index=0, session_id=session, input_tokens=tokens, block_size=BS, hashes=hashes
    )


@dataclass
class View:
    """A ClusterView built by hand: loads, per-replica matches and a simple cost model."""

    loads: list[ReplicaLoad]
    matches: dict[int, PrefixMatch] = field(default_factory=dict)
    now_s: float = 0.0
    queues_s: dict[int, float] = field(default_factory=dict)
    prefill_per_token_s: float = 1e-4
    host_block_s: float = 0.002
    disk_block_s: float = 0.01
    prefill_calls: list[tuple[int, int, int]] = field(default_factory=list)

    def match(self, replica: int, request: RouteRequest) -> PrefixMatch:
        return self.matches.get(replica, PrefixMatch())

    def queue_s(self, replica: int) -> float:
        return self.queues_s.get(replica, 0.0)

    def prefill_s(self, replica: int, tokens: int, context: int) -> float:
        self.prefill_calls.append((replica, tokens, context))
        return tokens * self.prefill_per_token_s

    def load_s(self, replica: int, match: PrefixMatch) -> float:
        return match.host * self.host_block_s + (match.disk + match.shared) * self.disk_block_s


def idle(n: int) -> View:
    return View([load(i) for i in range(n)])


# ---------------------------------------------------------------- registry and parameters


def test_builtin_names() -> None:
    assert builtin_router_names() == [
        "dynamo-kv",
        "least-loaded",
        "llm-d",
        "min-ttft",
        "power-of-two",
        "production-stack",
        "random",
        "round-robin",
        "session",
        "sglang-cache-aware",
    ]
    assert set(builtin_router_names()) <= set(router_names())


def test_duplicate_registration_raises() -> None:
    with pytest.raises(ValueError, match="'round-robin' registered twice"):
        register(RoundRobin)

    class Nameless(Router):
        pass

    with pytest.raises(ValueError, match="has no name"):
        register(Nameless)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown router 'nope'; valid: dynamo-kv, .*"):
        make_router("nope")
    try:
        resolve_router("nope")
    except UnknownNameError as exc:
        assert exc.kind == "router" and "sglang-cache-aware" in exc.valid


def test_parse_router_params() -> None:
    got = parse_router_params(
        "dynamo-kv.overlap_score_weight=2,sglang-cache-aware.balance_abs_threshold=16,"
        "production-stack.mode=kvaware,dynamo-kv.approximate=true,dynamo-kv.temperature=0.5"
    )
    assert got == {
        "dynamo-kv": {"overlap_score_weight": 2, "approximate": True, "temperature": 0.5},
        "sglang-cache-aware": {"balance_abs_threshold": 16},
        "production-stack": {"mode": "kvaware"},
    }
    assert parse_router_params(["my.mod:Cls.x=1"]) == {"my.mod:Cls": {"x": 1}}
    for bad in ("dynamo-kv=2", "overlap_score_weight=2", "dynamo-kv.temperature"):
        with pytest.raises(ConfigError, match=r"expected ROUTER\.NAME=VALUE"):
            parse_router_params(bad)


def test_params_fill_and_bad_params_name_router_and_parameter() -> None:
    """Router parameters are checked as policy parameters are (kvsim.plugin_params)."""
    r = make_router("dynamo-kv", {"overlap_score_weight": 2, "temperature": 0.5})
    assert r.params.overlap_score_weight == 2.0 and isinstance(r.params.overlap_score_weight, float)
    assert r.params.temperature == 0.5 and r.params.device_credit == 1.0
    assert make_router("dynamo-kv", {}).params == DynamoKv.Params()
    cases = {
        ("dynamo-kv", "nope", 1): r"router 'dynamo-kv': unknown parameter 'nope'; valid: .*",
        ("dynamo-kv", "temperature", "hot"): (
            r"router 'dynamo-kv': parameter temperature: expected a number, got 'hot'"
        ),
        ("dynamo-kv", "temperature", -1): r"router 'dynamo-kv': parameter 'temperature' must be",
        ("dynamo-kv", "temperature", float("nan")): r"temperature: expected a finite number",
        ("dynamo-kv", "approximate", 1): r"parameter approximate: expected true or false",
        ("sglang-cache-aware", "balance_abs_threshold", 1.5): (
            r"router 'sglang-cache-aware': parameter balance_abs_threshold: expected an integer"
        ),
        ("production-stack", "mode", "bogus"): (
            r"router 'production-stack': parameter 'mode' must be one of "
            r"prefixaware, loadaware, kvaware"
        ),
        ("round-robin", "x", 1): r"router 'round-robin' takes no parameters, got x",
    }
    for (name, key, value), pattern in cases.items():
        with pytest.raises(ConfigError, match=pattern) as info:
            make_router(name, {key: value})
        assert "\n" not in str(info.value)


PLUGIN = """
from kvsim.routers import Router

class Broken(Router):
    name = "broken"

    def choose(self, request, view, candidates):
        raise ValueError("boom")


class Stray(Router):
    name = "stray"

    def choose(self, request, view, candidates):
        return 99


class Last(Router):
    name = "last"

    def choose(self, request, view, candidates):
        return candidates[-1]


class NotARouter:
    pass
"""


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "kvsim_test_router_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "kvsim_test_router_plugin"


def test_module_class_plugin_runs_guarded(plugin_module: str) -> None:
    r = make_router(f"{plugin_module}:Last", None, random.Random(1))
    assert isinstance(r, GuardedRouter) and r.name == "last"
    assert r.choose(req(), idle(3), [0, 1, 2]) == 2
    assert r.choose_prefill(req(), idle(3), [0, 1]) == 1


def test_plugin_faults_are_plugin_errors(plugin_module: str) -> None:
    broken = make_router(f"{plugin_module}:Broken")
    with pytest.raises(
        PluginError,
        match=rf"^router '{plugin_module}:Broken': method 'choose' raised ValueError: boom$",
    ):
        broken.choose(req(), idle(2), [0, 1])
    with pytest.raises(PluginError, match="method 'choose_prefill' raised ValueError: boom"):
        broken.choose_prefill(req(), idle(2), [0, 1])
    stray = make_router(f"{plugin_module}:Stray")
    with pytest.raises(PluginError, match="method 'choose' returned 99, not one of the candidates"):
        stray.choose(req(), idle(2), [0, 1])
    with pytest.raises(KvsimError, match=r"is not a kvsim\.routers\.Router subclass"):
        make_router(f"{plugin_module}:NotARouter")
    with pytest.raises(KvsimError, match="cannot import Missing"):
        make_router(f"{plugin_module}:Missing")


def test_entry_point_plugin(plugin_module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [EntryPoint("ep-last", f"{plugin_module}:Last", "kvsim.routers")]
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: eps if group == "kvsim.routers" else []
    )
    assert "ep-last" in router_names() and "ep-last" not in builtin_router_names()
    r = make_router("ep-last")
    assert isinstance(r, GuardedRouter)
    assert r.choose(req(), idle(4), [1, 3]) == 3


def test_builtins_run_bare_and_pd_threshold() -> None:
    for name in builtin_router_names():
        r = make_router(name, None, random.Random(0))
        assert type(r) is resolve_router(name) and r.name == name
        assert r.pd_threshold_tokens == (16 if name == "llm-d" else None)
    assert LlmD.pd_threshold_tokens == 16
    assert make_router("llm-d", {"pd_threshold_tokens": 32}).pd_threshold_tokens == 32


# ---------------------------------------------------------------- every router


def random_state(rng: random.Random, n: int, as_numpy: bool) -> tuple[RouteRequest, View]:
    loads = [
        load(
            i,
            waiting=rng.randrange(4),
            running=rng.randrange(4),
            prefill_tokens=rng.randrange(0, 200),
            decode_blocks=rng.randrange(0, 50),
            kv_usage=rng.random(),
        )
        for i in range(n)
    ]
    matches = {i: PrefixMatch(device=rng.randrange(4), host=rng.randrange(3)) for i in range(n)}
    base = 1000 * rng.randrange(5)
    tokens = rng.choice([8, 64, 160, 170])
    hashes = list(range(base, base + tokens // BS))
    request = req(
        tokens,
        session=rng.randrange(20),
        hashes=np.array(hashes, dtype=np.uint64) if as_numpy else hashes,
    )
    return request, View(loads, matches, now_s=rng.random() * 100)


def test_same_seed_same_choices_and_always_a_candidate() -> None:
    """Same seed, same choices; the hash chain may be a list or a numpy array (as the engine
    may pass a slice of the trace's column)."""
    configs: list[tuple[str, dict[str, object] | None]] = [
        (name, None) for name in builtin_router_names()
    ]
    configs += [
        ("dynamo-kv", {"approximate": True}),
        ("dynamo-kv", {"temperature": 0.5, "decay": 1, "active_weight": 1}),
        ("llm-d", {"approximate": True, "lru_capacity_blocks": 8}),
        ("production-stack", {"mode": "loadaware"}),
        ("production-stack", {"mode": "kvaware", "kv_threshold_tokens": 100}),
        ("sglang-cache-aware", {"balance_abs_threshold": 2, "max_tree_size": 80}),
    ]
    for name, params in configs:
        runs = []
        for as_numpy in (False, False, True):
            r = make_router(name, params, random.Random(42))
            states = random.Random(7)
            chosen = []
            now_s = 0.0
            for _ in range(150):
                request, view = random_state(states, 4, as_numpy)
                now_s += states.random()
                view.now_s = now_s
                candidates = sorted(states.sample(range(4), states.randrange(1, 5)))
                w = r.choose(request, view, candidates)
                assert w in candidates, (name, params)
                chosen.append(w)
            runs.append(chosen)
        assert runs[0] == runs[1] == runs[2], (name, params)
        assert len(set(runs[0])) > 1, (name, params)  # the states do move it


def test_round_robin_rotates_per_candidate_set() -> None:
    r = make_router("round-robin")
    view = idle(4)
    assert [r.choose(req(), view, [0, 1, 2]) for _ in range(4)] == [0, 1, 2, 0]
    # P/D: decode pool [0, 1] and prefill pool [2, 3] alternate; each rotates on its own.
    r = make_router("round-robin")
    got = []
    for _ in range(3):
        got.append(r.choose(req(), view, [0, 1]))
        got.append(r.choose_prefill(req(), view, [2, 3]))
    assert got == [0, 2, 1, 3, 0, 2]


def test_random_is_uniform_over_candidates() -> None:
    r = make_router("random", None, random.Random(3))
    counts = Counter(r.choose(req(), idle(4), [0, 2, 3]) for _ in range(3000))
    assert set(counts) == {0, 2, 3}
    assert all(abs(c / 3000 - 1 / 3) < 0.04 for c in counts.values())


def test_least_loaded() -> None:
    # active = waiting + running: r0 2 + 3 = 5, r1 1 + 1 = 2, r2 0 + 2 = 2 -> tie r1/r2 -> r1.
    view = View([load(0, 2, 3), load(1, 1, 1), load(2, 0, 2)])
    r = make_router("least-loaded")
    assert r.choose(req(), view, [0, 1, 2]) == 1
    assert r.choose(req(), view, [0, 2]) == 2
    assert r.choose(req(), view, [2, 1]) == 1  # lowest index, not first listed


def test_power_of_two_expected_wait() -> None:
    r = make_router("power-of-two", None, random.Random(5))
    p = r.params
    assert (p.kv_pressure_weight, p.default_throughput) == (0.15, 2000.0)  # SMG least_load.rs
    # score = prefill_tokens / 2000 + 0.15 * k / (1 - k):
    # r0 4000 tokens, k 0 -> 2.0 s; r1 1000, k 0.5 -> 0.5 + 0.15 = 0.65 s;
    # r2 0, k 0.9 -> 0.15 * 9 = 1.35 s; r3 2000, k 0 -> 1.0 s.
    # Active requests 0, 5, 1, 2 would have picked r0 first (the old count rule).
    view = View(
        [
            load(0, prefill_tokens=4000),
            load(1, 3, 2, prefill_tokens=1000, kv_usage=0.5),
            load(2, 1, prefill_tokens=0, kv_usage=0.9),
            load(3, 0, 2, prefill_tokens=2000),
        ]
    )
    assert [r.score(x) for x in view.loads] == pytest.approx([2.0, 0.65, 1.35, 1.0])
    # Two candidates: both are always drawn, so the lower score (r1) always wins.
    assert {r.choose(req(), view, [0, 1]) for _ in range(50)} == {1}
    assert r.choose(req(), view, [2]) == 2
    # Four: r1 wins whenever drawn (3 of 6 pairs = 1/2), r3 wins {r3,r2}, {r3,r0} = 1/3,
    # r2 wins {r2,r0} = 1/6, r0 never.
    counts = Counter(r.choose(req(), view, [0, 1, 2, 3]) for _ in range(3000))
    assert counts[0] == 0
    assert abs(counts[1] / 3000 - 1 / 2) < 0.04
    assert abs(counts[3] / 3000 - 1 / 3) < 0.04
    assert abs(counts[2] / 3000 - 1 / 6) < 0.04
    # A full cache is clipped at k = 0.999: 0.15 * 999 = 149.85 s, worse than 100,000 queued
    # tokens (50 s).
    full = View([load(0, kv_usage=1.0), load(1, prefill_tokens=100_000)])
    assert r.score(full.loads[0]) == pytest.approx(149.85)
    assert {r.choose(req(), full, [0, 1]) for _ in range(20)} == {1}
    # Equal scores: a fair coin, so both replicas get traffic.
    assert {r.choose(req(), idle(2), [0, 1]) for _ in range(50)} == {0, 1}


def test_session_sticky_spread_and_consistent() -> None:
    r = make_router("session")
    view = idle(4)
    busy = View([load(0, 50, 50), load(1), load(2), load(3)])
    every = [0, 1, 2, 3]
    home = {s: r.choose(req(session=s), view, every) for s in range(2000)}
    # Sticky: every turn of a session lands on the same replica, whatever the load.
    for s in range(0, 2000, 97):
        assert r.choose(req(session=s), busy, every) == home[s]
        assert make_router("session").choose(req(session=s), view, every) == home[s]
    # Spread: 160 points per replica share the ring within a few percent.
    share = Counter(home.values())
    assert all(0.18 < share[w] / 2000 < 0.32 for w in every), share
    # Consistent: dropping replica 3 moves only its sessions.
    for s, w in home.items():
        if w != 3:
            assert r.choose(req(session=s), view, [0, 1, 2]) == w
    # Deterministic across processes (BLAKE2b, not the salted hash()): a pinned golden.
    assert [home[s] for s in range(10)] == GOLDEN_SESSIONS


GOLDEN_SESSIONS = [1, 0, 2, 2, 1, 3, 3, 1, 0, 1]


def test_dynamo_kv_worked_example() -> None:
    # Request 160 tokens = 10 blocks of 16.
    # r0: device 6, host 2; prefill 40 tokens = ceil(2.5) = 3 blocks; decode 40; active 5.
    #     credit = 1*1*6 + 0.75*2 = 7.5; raw = 10 + 3 = 13; logit = (13 - 7.5) + 40 = 45.5
    # r1: disk 4, shared 4; prefill 0; decode 40; active 0.
    #     credit = 0.25*4 + 0*4 = 1; raw = 10; logit = (10 - 1) + 40 = 49
    # r2: device 10; prefill 160 tokens = 10 blocks; decode 35; active 4.
    #     credit = 10; raw = 10 + 10 = 20; logit = (20 - 10) + 35 = 45   -> r2
    view = View(
        [
            load(0, 2, 3, prefill_tokens=40, decode_blocks=40),
            load(1, 0, 0, prefill_tokens=0, decode_blocks=40),
            load(2, 1, 3, prefill_tokens=160, decode_blocks=35),
        ],
        {
            0: PrefixMatch(device=6, host=2),
            1: PrefixMatch(disk=4, shared=4),
            2: PrefixMatch(device=10),
        },
    )
    every = [0, 1, 2]
    r = make_router("dynamo-kv")
    assert r.logits(req(), view, every) == pytest.approx([45.5, 49.0, 45.0])
    assert r.choose(req(), view, every) == 2
    # decay d = 1: min prefill = 0 (r1).
    # r0: decay = 1/(1 + 1*(40/16)/10) = 0.8; credit = 0.8*6 + 1.5 = 6.3; logit = 6.7 + 40 = 46.7
    # r1: no device overlap: 49;  r2: decay = 1/(1 + 10/10) = 0.5; credit 5; 15 + 35 = 50 -> r0
    r = make_router("dynamo-kv", {"decay": 1})
    assert r.logits(req(), view, every) == pytest.approx([46.7, 49.0, 50.0])
    assert r.choose(req(), view, every) == 0
    # active_weight a = 2: 45.5 + 10 = 55.5, 49 + 0 = 49, 45 + 8 = 53 -> r1
    r = make_router("dynamo-kv", {"active_weight": 2})
    assert r.logits(req(), view, every) == pytest.approx([55.5, 49.0, 53.0])
    assert r.choose(req(), view, every) == 1
    # s = 2: 2*5.5 + 40 = 51, 2*9 + 40 = 58, 2*10 + 35 = 55 -> r0
    r = make_router("dynamo-kv", {"overlap_score_weight": 2})
    assert r.logits(req(), view, every) == pytest.approx([51.0, 58.0, 55.0])
    assert r.choose(req(), view, every) == 0
    # m_shared = 1: r1 credit = 1 + 4 = 5; logit = 5 + 40 = 45 = r2's -> tie, seeded coin.
    r = make_router("dynamo-kv", {"shared_weight": 1}, random.Random(11))
    assert r.logits(req(), view, every) == pytest.approx([45.5, 45.0, 45.0])
    counts = Counter(r.choose(req(), view, every) for _ in range(400))
    assert set(counts) == {1, 2} and 150 < counts[1] < 250


def test_dynamo_kv_no_credit_beyond_prefill() -> None:
    # Credit beyond the request's blocks is clipped: raw 10, credit 10 + 0.75*5 -> max(0, ...) = 0.
    view = View([load(0, decode_blocks=7)], {0: PrefixMatch(device=10, host=5)})
    assert make_router("dynamo-kv").logits(req(), view, [0]) == [7.0]


def test_dynamo_kv_temperature_distribution() -> None:
    # 1-block request, no cache, no queue: logit = 1 + decode_blocks = 1, 6, 11.
    # Normalised (l - 1)/(11 - 1) = 0, 0.5, 1; T = 1: P ∝ 1, e^-0.5, e^-1 = 0.5065, 0.3072, 0.1863.
    view = View([load(0), load(1, decode_blocks=5), load(2, decode_blocks=10)])
    r = make_router("dynamo-kv", {"temperature": 1.0}, random.Random(2))
    n = 4000
    counts = Counter(r.choose(req(16), view, [0, 1, 2]) for _ in range(n))
    for w, p in zip([0, 1, 2], [0.5065, 0.3072, 0.1863], strict=True):
        assert abs(counts[w] / n - p) < 0.03, counts
    # T = 0.1: P ∝ 1, e^-5, e^-10 -> r0 with probability 0.9932.
    r = make_router("dynamo-kv", {"temperature": 0.1}, random.Random(2))
    counts = Counter(r.choose(req(16), view, [0, 1, 2]) for _ in range(1000))
    assert counts[0] > 970
    # All logits equal: uniform.
    counts = Counter(r.choose(req(16), idle(2), [0, 1]) for _ in range(1000))
    assert 420 < counts[0] < 580


def test_dynamo_kv_approximate_learns_own_decisions_with_ttl() -> None:
    # The view claims replica 1 holds everything; approximate mode must not look.
    view = View([load(0), load(1)], {1: PrefixMatch(device=10)})
    r = make_router("dynamo-kv", {"approximate": True}, random.Random(4))
    assert r.logits(req(), view, [0, 1]) == [10.0, 10.0]
    first = r.choose(req(), view, [0, 1])
    view.now_s = 10.0
    # Routed blocks count as device overlap: logit 10 - 10 = 0 there, 10 elsewhere.
    expected = [0.0, 10.0] if first == 0 else [10.0, 0.0]
    assert r.logits(req(), view, [0, 1]) == expected
    assert r.choose(req(), view, [0, 1]) == first  # stamped again at t = 10
    view.now_s = 130.0  # exactly 120 s later: still believed
    assert r.logits(req(), view, [0, 1]) == expected
    view.now_s = 130.5  # past the TTL: forgotten
    assert r.logits(req(), view, [0, 1]) == [10.0, 10.0]


def llm_d_view() -> View:
    # Request 10 full blocks.
    # r0: device 10            -> prefix 1.0; waiting 6; kv 0.0
    # r1: device 4 + host 5    -> raw 4 + 0.8*5 = 8 -> 0.8; waiting 3; kv 0.9
    # r2: nothing              -> 0.0; waiting 0; kv 0.2
    # queue: maxQ 6, minQ 0 -> r0 (6-6)/6 = 0, r1 (6-3)/6 = 0.5, r2 1.0
    return View(
        [load(0, waiting=6, kv_usage=0.0), load(1, waiting=3, kv_usage=0.9), load(2, kv_usage=0.2)],
        {0: PrefixMatch(device=10), 1: PrefixMatch(device=4, host=5)},
    )


def test_llm_d_worked_example() -> None:
    view = llm_d_view()
    every = [0, 1, 2]
    r = make_router("llm-d")
    # S = 2*prefix + queue + (1 - kv): r0 2 + 0 + 1 = 3.0; r1 1.6 + 0.5 + 0.1 = 2.2;
    # r2 0 + 1 + 0.8 = 1.8 -> r0
    assert r.scores(req(), view, every) == pytest.approx([3.0, 2.2, 1.8])
    assert r.choose(req(), view, every) == 0
    # Prefill profile (P/D): 2*prefix + queue, no kv-utilization: r0 2.0; r1 2.1; r2 1.0 -> r1
    assert r.scores(req(), view, every, prefill=True) == pytest.approx([2.0, 2.1, 1.0])
    assert r.choose_prefill(req(), view, every) == 1
    # Clipped: gpu weight 2 makes r0's raw 20/10, scored as 1; r1 8 + 4 = 12/10 -> 1 too.
    r = make_router("llm-d", {"gpu_tier_weight": 2.0})
    assert r.scores(req(), view, every) == pytest.approx([3.0, 2.6, 1.8])
    # Queue all equal -> 1 each; load-aware on: 0.5 * (1 - q/128) with q = 64 -> 0.25.
    flat = View([load(0, waiting=64), load(1, waiting=64)])
    r = make_router("llm-d", {"load_aware_weight": 1.0})
    assert r.scores(req(), flat, [0, 1]) == pytest.approx([2.25, 2.25])


def test_llm_d_ties_shuffled() -> None:
    r = make_router("llm-d", None, random.Random(9))
    counts = Counter(r.choose(req(), idle(3), [0, 1, 2]) for _ in range(600))
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 150


def test_llm_d_approximate_lru() -> None:
    r = make_router("llm-d", {"approximate": True, "lru_capacity_blocks": 12}, random.Random(1))
    view = View([load(0), load(1)], {1: PrefixMatch(device=10)})  # ignored
    a, b = req(first_hash=100), req(first_hash=200)
    assert [r.prefix_score(a, view, w) for w in (0, 1)] == [0.0, 0.0]
    w = r.choose(a, view, [0, 1])
    assert r.prefix_score(a, view, w) == 1.0 and r.prefix_score(a, view, 1 - w) == 0.0
    assert r.choose(a, view, [0, 1]) == w  # 2 points of prefix beat a tie elsewhere
    # b also goes to w only if it ties... route it there by offering w alone.
    r.choose(b, view, [w])
    # LRU of 12: a's blocks went in deepest first, so a9..a2 are evicted; a0, a1 stay.
    assert r.prefix_score(a, view, w) == pytest.approx(0.2)
    assert r.prefix_score(b, view, w) == 1.0
    # Only the first max_prefix_blocks blocks count.
    r = make_router("llm-d", {"approximate": True, "max_prefix_blocks": 4})
    r.choose(req(), idle(1), [0])
    assert r.prefix_score(req(), idle(1), 0) == 1.0
    assert r.prefix_score(req(hashes=[1000, 1001, 9, 9, 9]), idle(1), 0) == 0.5


def test_llm_d_approximate_lru_auto_tunes_to_the_replica_hbm() -> None:
    """llm-d's approximate prefix plugin defaults to autoTune: each server's LRU holds as many
    blocks as its KV cache (31,250 only when auto-tuning is off)."""
    assert LlmD.Params().lru_capacity_blocks == 0
    small = dataclasses.replace(load(0), capacity_blocks=12)
    view = View([small])
    a, b = req(first_hash=100), req(48, first_hash=200)
    r = make_router("llm-d", {"approximate": True})
    r.choose(a, view, [0])
    r.choose(b, view, [0])
    # 10 + 3 = 13 blocks > 12: the least recent, a's deepest block a9, goes: a scores 9/10.
    assert r.prefix_score(a, view, 0) == pytest.approx(0.9)
    assert r.prefix_score(b, view, 0) == 1.0
    # With the plugin's fixed fallback (31,250) nothing goes.
    r = make_router("llm-d", {"approximate": True, "lru_capacity_blocks": 31250})
    r.choose(a, view, [0])
    r.choose(b, view, [0])
    assert r.prefix_score(a, view, 0) == 1.0


def test_sglang_defaults_are_what_smg_launch_ships() -> None:
    """smg-project/smg@f8daa88 bindings/python/src/smg/router_args.py (RouterArgs)."""
    p = SglangCacheAware.Params()
    assert (p.cache_threshold, p.balance_abs_threshold, p.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (p.eviction_interval_s, p.max_tree_size) == (60.0, 2**26)
    assert (p.balance_token_usage_threshold, p.overload_token_usage_threshold) == (1.0, 1.0)


def test_sglang_hit_goes_to_the_least_loaded_holder() -> None:
    r = make_router("sglang-cache-aware", None, random.Random(0))
    assert isinstance(r, SglangCacheAware)
    r.tree(0).insert(req().hashes, 0.0)
    r.tree(1).insert(req().hashes, 0.0)
    # 10 of 10 blocks: 160/160 = 1 > 0.3 on r0 and r1; active 5 and 3 -> r1. Gate: mean
    # (5 + 3 + 0)/3 = 2.67, 3 > 1.5 * 2.67 = 4 fails -> r1 stays. (The old rule, longest match
    # at the lowest index, sent it to r0.)
    view = View([load(0, 2, 3), load(1, 0, 3), load(2)])
    assert r.choose(req(), view, [0, 1, 2]) == 1
    assert r.routed == {1: 1}
    # Equal holders at equal load: uniform among them.
    r = make_router("sglang-cache-aware", None, random.Random(1))
    r.tree(0).insert(req().hashes, 0.0)
    r.tree(1).insert(req().hashes, 0.0)
    counts = Counter(
        r.choose(req(), View([load(0), load(1), load(2, 1)]), [0, 1, 2]) for _ in range(400)
    )
    assert set(counts) == {0, 1} and 150 < counts[0] < 250


def test_sglang_per_request_gate_against_the_mean() -> None:
    # Only r0 holds the prompt. Active 100, 0, 0: mean 33.3; 100 > 1.5 * 33.3 = 50 and
    # 100 > 33.3 + 64 = 97.3 -> spill to the least loaded, r1 (r1, r2 tie at 0 load and 0 routed:
    # lowest index), and r1's tree learns the prompt.
    r = make_router("sglang-cache-aware")
    r.tree(0).insert(req().hashes, 0.0)
    assert r.choose(req(), View([load(0, 40, 60), load(1), load(2)]), [0, 1, 2]) == 1
    assert r.tree(1).match(req().hashes) == 10
    # Active 90, 0, 0: mean 30; 90 > 45 but 90 <= 30 + 64 = 94 -> r0 keeps it. (The old
    # fleet-wide test, 90 - 0 > 32 and 90 > 1.1 * 0, sent it to the least loaded.)
    r = make_router("sglang-cache-aware")
    r.tree(0).insert(req().hashes, 0.0)
    assert r.choose(req(), View([load(0, 30, 60), load(1), load(2)]), [0, 1, 2]) == 0
    # balance_abs_threshold = 50: 90 > 30 + 50 = 80 -> spills to r1.
    r = make_router("sglang-cache-aware", {"balance_abs_threshold": 50})
    r.tree(0).insert(req().hashes, 0.0)
    assert r.choose(req(), View([load(0, 30, 60), load(1), load(2)]), [0, 1, 2]) == 1


def test_sglang_miss_goes_to_the_least_loaded_not_the_smallest_tree() -> None:
    hashes = req().hashes
    # r0: first 3 of the 10 blocks + 100 others; r1: 20 unrelated; r2: empty.
    r = make_router("sglang-cache-aware")
    r.tree(0).insert(hashes[:3], 0.0)
    r.tree(0).insert(list(range(1, 101)), 0.0)
    r.tree(1).insert(list(range(500, 520)), 0.0)
    # 3 blocks = 48 of 160 tokens = 0.3, not > 0.3 -> least loaded: active 1, 0, 4 -> r1
    # (the old rule sent it to the smallest tree, r2).
    busy = View([load(0, 1), load(1), load(2, 4)])
    assert r.choose(req(), busy, [0, 1, 2]) == 1
    # 4 blocks = 64/160 = 0.4 > 0.3 -> by cache, r0 (under the old 0.5 it was a miss).
    r.tree(0).insert(hashes[:4], 0.0)
    assert r.choose(req(hashes=[*hashes[:4], 1, 2, 3, 4, 5, 6]), busy, [0, 1, 2]) == 0
    # The rate counts every prompt token: 4 blocks of a 250-token prompt = 64/250 = 0.256.
    assert r.choose(req(250, hashes=[*hashes[:4], 700, 800, 900]), busy, [0, 1, 2]) == 1
    # Misses at equal load go to the replica routed to least (SMG's tie key), so they alternate.
    r = make_router("sglang-cache-aware")
    picks = [r.choose(req(first_hash=100 * i), idle(2), [0, 1]) for i in range(1, 5)]
    assert picks == [0, 1, 0, 1]


def test_sglang_trims_the_whole_tree_in_tokens() -> None:
    # max_tree_size 64 tokens = 4 blocks of 16, for all replicas together.
    r = make_router("sglang-cache-aware", {"max_tree_size": 64})
    a, b, c = req(first_hash=100), req(48, first_hash=200), req(16, first_hash=300)
    r.choose(a, View([load(0), load(1)], now_s=0.0), [0])
    r.choose(b, View([load(0), load(1)], now_s=10.0), [1])
    r.choose(c, View([load(0), load(1)], now_s=59.9), [1])
    assert (len(r.tree(0)), len(r.tree(1))) == (10, 4)  # no trim before 60 s
    # At 60 s: 14 blocks, keep 4. Oldest first: a9..a0 (t=0, deepest first), then b's (t=10):
    # 10 go, a's all; b0..b2 and c0 stay; then the request routed now is added.
    r.choose(a, View([load(0), load(1)], now_s=60.0), [1])
    assert len(r.tree(0)) == 0
    assert r.tree(1).match(b.hashes) == 3 and r.tree(1).match(c.hashes) == 1
    assert len(r.tree(1)) == 14  # b, c and now a
    # Trimmed again to 4: b (t=10), c (t=59.9), then a's 6 deepest blocks (t=60) go; a0..a3 stay.
    assert r.trim(64, BS) == 10
    assert r.tree(1).match(a.hashes) == 4 and r.tree(1).match(b.hashes) == 0


def test_sglang_kv_pressure_triggers() -> None:
    r = make_router("sglang-cache-aware")
    r.tree(0).insert(req().hashes, 0.0)
    hot = View([load(0, 0, 1, kv_usage=0.95), load(1, 0, 2, kv_usage=0.1)])
    assert r.choose(req(), hot, [0, 1]) == 0  # both triggers off at 1.0: the holder
    # Overload ceiling 0.9: 0.95 > 0.9 -> least loaded, r0 (active 1 < 2).
    r = make_router("sglang-cache-aware", {"overload_token_usage_threshold": 0.9})
    r.tree(1).insert(req().hashes, 0.0)
    assert r.choose(req(), hot, [0, 1]) == 0
    # Spread 0.5: 0.95 - 0.1 = 0.85 > 0.5 -> least loaded, r0, though r1 holds the prompt.
    r = make_router("sglang-cache-aware", {"balance_token_usage_threshold": 0.5})
    r.tree(1).insert(req().hashes, 0.0)
    assert r.choose(req(), hot, [0, 1]) == 0
    r = make_router("sglang-cache-aware")
    r.tree(1).insert(req().hashes, 0.0)
    assert r.choose(req(), hot, [0, 1]) == 1  # off: the holder


def test_production_stack_prefixaware() -> None:
    r = make_router("production-stack", None, random.Random(3))
    assert isinstance(r, ProductionStack)
    hashes = req().hashes
    r.tries[1] = BlockIndex()
    r.tries[1].insert(hashes[:4], 0.0)
    r.tries[2] = BlockIndex()
    r.tries[2].insert(hashes[:7], 0.0)
    # longest match: r2 (7) over r1 (4) and r0 (0), whatever the load
    busy = View([load(0), load(1), load(2, 40, 40)])
    assert r.choose(req(), busy, [0, 1, 2]) == 2
    assert r.tries[2].match(hashes) == 10  # the trie learnt the rest
    # No match anywhere: uniform among the tied candidates.
    counts = Counter(r.choose(req(first_hash=10**6 + 100 * i), busy, [0, 1]) for i in range(400))
    assert set(counts) == {0, 1} and 150 < counts[0] < 250


def test_production_stack_loadaware() -> None:
    # matched/10: r0 8 -> 0.8, r1 10 -> 1.0, r2 0; active 4, 10, 1 -> mean 5, max(1, mean) 5.
    # r0: 0.8 - (4 - 5)/5 = 1.0; r1: 1.0 - (10 - 5)/5 = 0.0; r2: 0 - (1 - 5)/5 = 0.8 -> r0
    hashes = req().hashes
    view = View([load(0, 2, 2), load(1, 5, 5), load(2, 0, 1)])
    for beta, expected, want in ((1.0, [1.0, 0.0, 0.8], 0), (0.0, [0.8, 1.0, 0.0], 1)):
        r = make_router("production-stack", {"mode": "loadaware", "beta": beta})
        for w, n in ((0, 8), (1, 10)):
            r.tries[w] = BlockIndex()
            r.tries[w].insert(hashes[:n], 0.0)
        assert r.loadaware_scores(req(), view, [0, 1, 2]) == pytest.approx(expected)
        assert r.choose(req(), view, [0, 1, 2]) == want
    # Under one request per replica the spread is max(1, mean) = 1: active 0, 1 -> mean 0.5;
    # r0: 0 - (0 - 0.5)/1 = 0.5; r1: 0 - (1 - 0.5)/1 = -0.5 -> r0.
    r = make_router("production-stack", {"mode": "loadaware"})
    assert r.loadaware_scores(req(), View([load(0), load(1, 1)]), [0, 1]) == [0.5, -0.5]


def test_production_stack_kvaware() -> None:
    r = make_router("production-stack", {"mode": "kvaware"})
    # 5000 tokens: a holder needs >= 5000 - 2000 = 3000 cached tokens = 188 blocks of 16.
    # r0 150 blocks = 2400 (no), r1 190 = 3040 (yes, active 9), r2 200 = 3200 (yes, active 20)
    view = View(
        [load(0), load(1, 4, 5), load(2, 10, 10)],
        {0: PrefixMatch(device=150), 1: PrefixMatch(device=190), 2: PrefixMatch(host=200)},
    )
    assert r.choose(req(5000), view, [0, 1, 2]) == 2  # most matched holder
    view.matches[1] = PrefixMatch(device=100, disk=100)  # 200 too: tie -> fewer active r1
    assert r.choose(req(5000), view, [0, 1, 2]) == 1
    # No holder: least loaded (r0, active 0).
    view.matches = {0: PrefixMatch(device=10), 1: PrefixMatch(device=20)}
    assert r.choose(req(5000), view, [0, 1, 2]) == 0
    # Short prompts (<= 2000 tokens) qualify everywhere: best holder r1, else by load.
    assert r.choose(req(1000), view, [0, 1, 2]) == 1
    assert r.choose(req(1000), View([load(0, 3), load(1, 1), load(2, 2)]), [0, 1, 2]) == 1
    assert r.tries == {}  # kvaware keeps no trie


def test_min_ttft_worked_example() -> None:
    # 1600 tokens = 100 blocks; prefill 1e-4 s per new token, host load 0.002 s per block.
    # r0: queue 0.05; device 50 -> cached 800, new 800 -> 0.08; total 0.13
    # r1: queue 0.00; nothing  -> new 1600 -> 0.16; total 0.16
    # r2: queue 0.02; device 20 + host 60 -> cached 1280, new 320 -> 0.032; load 0.12; 0.172
    # r3: queue 0.20; device 100 -> cached min(1600, 1599) = 1599, new 1 -> 0.0001; 0.2001
    view = View(
        [load(i) for i in range(4)],
        {
            0: PrefixMatch(device=50),
            2: PrefixMatch(device=20, host=60),
            3: PrefixMatch(device=100),
        },
        queues_s={0: 0.05, 2: 0.02, 3: 0.2},
    )
    r = make_router("min-ttft")
    assert isinstance(r, MinTtft)
    request = req(1600)
    est = [r.estimate_s(request, view, w) for w in range(4)]
    assert est == pytest.approx([0.13, 0.16, 0.172, 0.2001])
    assert view.prefill_calls == [(0, 800, 800), (1, 1600, 0), (2, 320, 1280), (3, 1, 1599)]
    assert r.choose(request, view, [0, 1, 2, 3]) == 0
    assert r.choose(request, view, [1, 2, 3]) == 1
    # Tie -> lowest index, whatever the candidate order.
    assert r.choose(request, idle(3), [2, 1]) == 1


def test_block_index() -> None:
    index = BlockIndex()
    index.insert([1, 2, 3], 5.0)
    index.insert([1, 4], 6.0)
    assert index.match([1, 2, 3, 9]) == 3 and index.match([2]) == 1 and index.match([9, 1]) == 0
    assert index.match([1, 2, 3], limit=2) == 2
    assert len(index) == 4 and 4 in index
    assert index.expire(6.0) == 2  # 3 and 2 (stamped 5.0) go; 1 was re-stamped at 6.0
    assert index.match([1, 2]) == 1
    assert index.trim(1) == 1 and len(index) == 1 and 1 in index  # 4 deeper, older in order


def test_default_router_params_match_the_engines() -> None:
    assert DynamoKv.Params() == DynamoKv.Params(
        overlap_score_weight=1.0,
        device_credit=1.0,
        decay=0.0,
        active_weight=0.0,
        shared_weight=0.0,
        temperature=0.0,
        approximate=False,
    )
    q = ProductionStack.Params()
    assert (q.mode, q.beta, q.kv_threshold_tokens) == ("prefixaware", 1.0, 2000)
    s = LlmD.Params()
    assert (s.prefix_weight, s.queue_weight, s.kv_utilization_weight) == (2.0, 1.0, 1.0)
    assert (s.gpu_tier_weight, s.cpu_tier_weight, s.pd_threshold_tokens) == (1.0, 0.8, 16)

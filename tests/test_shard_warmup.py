"""The cache-only warm-up rebuilds what the timed engine holds in every tier.

When requests do not overlap in time (each finishes long before the next arrives), the
timed engine and the instant replay (kvsim.engine.warmup) make the same cache decisions, so at
a window's start every replica's HBM and every lower tier must hold the same blocks, whatever
the trace. Hypothesis draws the traces: shared and private prefixes, replies, several replicas,
an HBM and a DRAM small enough to evict.
"""

from __future__ import annotations

import numpy as np
import simpy
from helpers import Req, make_trace
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvsim.engine import EngineConfig
from kvsim.engine.assemble import RunParts, assemble
from kvsim.engine.resolve import resolve_engine
from kvsim.engine.trace_view import TraceRequests
from kvsim.engine.warmup import horizon_blocks, replay_horizon, warm_up
from kvsim.engine.workload import Workload
from kvsim.hardware import load_profile
from kvsim.metrics.requests import RequestLog
from kvsim.metrics.timeline import Timeline
from kvsim.models import load_model

GAP_S = 60.0  # far longer than any request here takes: nothing overlaps


def _contents(fleet) -> list[dict[str, frozenset[int]]]:
    """Per replica: the blocks HBM caches and each lower tier holds."""
    out = []
    for replica in fleet.replicas:
        kv = replica.kv
        tiers = {"hbm": frozenset(kv.pool.refs)}
        where = kv.hierarchy.where.as_dict()
        for tier in kv.hierarchy.tiers:
            assert tier.incoming == 0, "a write still in flight: the gap is too short"
            tiers[tier.name] = frozenset(k for k, t in where.items() if t == tier.index)
        out.append(tiers)
    return out


def _state_at(
    trace, run, at_s: float, warm: bool, horizon: bool = False
) -> list[dict[str, frozenset[int]]]:
    """Tier contents at `at_s`: from the timed engine, or (`warm`) from the instant replay of
    the requests before `at_s` (`horizon`: only the recent ones a window replays) followed by
    the timed engine."""
    env = simpy.Environment()
    source = TraceRequests(trace, run.config.block_size)
    timed = source.arrival_s >= at_s if warm else None
    workload = Workload(env, source, run, RequestLog(source.n, 1), None, timed)
    fleet = assemble(RunParts.build(env, run, source), workload.finished)
    timeline = Timeline(env, fleet.replicas, 3600.0, lambda: workload.completed)
    if warm:
        assert timed is not None
        rows = np.flatnonzero(~timed)
        if horizon:
            rows = replay_horizon(source, rows, horizon_blocks(fleet))
        env.process(warm_up(env, workload, fleet, rows))
    workload.start(fleet, timeline, from_s=at_s if warm else 0.0)
    seen: list = []

    def probe():
        yield env.timeout(at_s)
        seen.append(_contents(fleet))

    env.process(probe())
    env.run()
    return seen[0]


def _run(replicas: int, hbm_blocks: int, dram_blocks: int):
    model = load_model("llama-3.2-1b")
    profile = load_profile("h100-sxm")
    base = resolve_engine(EngineConfig(num_gpu_blocks=hbm_blocks), model, profile)
    tier_bytes = base.block_bytes * base.config.tp * dram_blocks
    below = {"tiers": "hbm,dram", "tier_capacity": f"dram={tier_bytes}B"} if dram_blocks else {}
    config = EngineConfig(num_gpu_blocks=hbm_blocks, replicas=replicas, prefetch=False, **below)
    return resolve_engine(config, model, profile)


def _trace(reqs: list[tuple[int, int, int, int]]):
    """One request a minute: a shared prefix, its own prompt tokens after it, a reply."""
    return make_trace(
        [
            Req(
                segments=[(1000 + p, 16 * blocks), *([(5000 + i, own)] if own else [])],
                output_tokens=out,
                arrival_s=GAP_S * i,
                output_hash=9000 + i,
            )
            for i, (p, blocks, own, out) in enumerate(reqs)
        ]
    )


request = st.tuples(
    st.integers(0, 5),  # which shared prefix (a system prompt, a document)
    st.integers(1, 6),  # its length in blocks
    st.integers(0, 40),  # private prompt tokens after it
    st.integers(1, 40),  # reply tokens
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(request, min_size=4, max_size=24),
    replicas=st.integers(1, 3),
    hbm=st.integers(12, 30),
    dram=st.integers(4, 40),
    cut=st.floats(0.25, 0.9),
)
@example(  # a fresh clone's draw: a whole cached prompt is recomputed, and the reply's block
    # then evicts the cached copy (the replay must offer the prompt before allocating the reply)
    reqs=[(2, 1, 0, 1), (0, 1, 0, 1), (1, 6, 9, 40), (2, 1, 0, 2), (0, 1, 0, 1)],
    replicas=1,
    hbm=12,
    dram=4,
    cut=0.875,
)
def test_warm_up_rebuilds_every_tier(reqs, replicas, hbm, dram, cut) -> None:
    trace = _trace(reqs)
    run = _run(replicas, hbm, dram)
    at_s = GAP_S * int(len(reqs) * cut) - 1.0
    assert _state_at(trace, run, at_s, warm=True) == _state_at(trace, run, at_s, warm=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(request, min_size=20, max_size=60), hbm=st.integers(12, 20))
@example(
    reqs=[(0, 1, 0, 1)] * 14
    + [(2, 2, 0, 1), (0, 1, 0, 32), (3, 6, 0, 1), (2, 2, 0, 16), (1, 6, 0, 32), (0, 6, 1, 15)],
    hbm=12,
)
def test_the_recent_past_is_enough_for_hbm_under_lru(reqs, hbm) -> None:
    """Replaying only the requests whose blocks fill HBM twice leaves HBM as replaying them
    all does (LRU forgets the rest). Exact with nothing below HBM. A tier below can keep a
    block from before the horizon (hypothesis found a 1-block DRAM that does), and through the
    load-or-recompute choice that block can change HBM too (hypothesis found a 12-block HBM
    over a 36-block DRAM 6 blocks apart once a short chunk over cached context got cheaper):
    an approximation bench_shards.py measures with the rest."""
    trace = _trace(reqs)
    run = _run(1, hbm, 0)
    at_s = GAP_S * len(reqs) - 1.0
    recent = _state_at(trace, run, at_s, True, horizon=True)
    whole = _state_at(trace, run, at_s, True)
    assert [r["hbm"] for r in recent] == [r["hbm"] for r in whole]


def test_the_horizon_keeps_the_latest_requests_that_fill_the_caches() -> None:
    from kvsim.engine.trace_view import TraceRequests

    # 40 requests of 4 private blocks each (3 of prompt, 1 of reply), one a minute
    rows = [Req([(100 + i, 48)], 17, arrival_s=GAP_S * i, output_hash=7000 + i) for i in range(40)]
    source = TraceRequests(make_trace(rows), 16)
    every = np.arange(40)
    kept = replay_horizon(source, every, blocks=10)  # 12 blocks: the latest 3 requests
    assert sorted(kept.tolist()) == list(range(37, 40))
    assert sorted(replay_horizon(source, every, 10_000).tolist()) == list(range(40))
    assert replay_horizon(source, every[:0], 10).size == 0


def test_a_load_aware_router_spreads_the_warm_up_over_replicas() -> None:
    """Least-loaded sends a request to the lowest index on a tie: were the instant replay to
    show it no load, every warm-up request would land on replica 0."""
    rows = [Req([(100 + i, 64)], 200, arrival_s=0.01 * i, output_hash=7000 + i) for i in range(30)]
    trace = make_trace(rows)
    model = load_model("llama-3.2-1b")
    config = EngineConfig(num_gpu_blocks=200, replicas=3, router="least-loaded", prefetch=False)
    run = resolve_engine(config, model, load_profile("h100-sxm"))
    env = simpy.Environment()
    source = TraceRequests(trace, 16)
    timed = np.zeros(source.n, dtype=bool)
    workload = Workload(env, source, run, RequestLog(source.n, 0), None, timed)
    fleet = assemble(RunParts.build(env, run, source), workload.finished)
    workload._fleet = fleet  # the warm-up makes its requests through the workload
    env.process(warm_up(env, workload, fleet, np.arange(source.n)))
    env.run()
    cached = [len(r.kv.pool.refs) for r in fleet.replicas]
    assert min(cached) > 0 and max(cached) - min(cached) <= 2 * 17  # a request's blocks apart

"""The composition root builds replicas and clusters that tests can drive directly: a real
scheduler over a real KV-cache manager, pool and tiers, no fakes."""

from __future__ import annotations

import simpy
from helpers import Req, make_trace

from kvsim.engine import EngineConfig
from kvsim.engine.assemble import RunParts, assemble, build_replica
from kvsim.engine.resolve import resolve_engine
from kvsim.engine.trace_view import TraceRequests
from kvsim.hardware import load_profile
from kvsim.kvcache.request import Request

MODEL_NAME, PROFILE_NAME = "llama-3.1-8b", "h100-sxm"


def _parts(config: EngineConfig, reqs: list[Req]) -> RunParts:
    from kvsim.models import load_model

    run = resolve_engine(config, load_model(MODEL_NAME), load_profile(PROFILE_NAME))
    trace = make_trace(reqs)
    return RunParts.build(simpy.Environment(), run, TraceRequests(trace, config.block_size))


def _request(parts: RunParts, i: int) -> Request:
    source = parts.source
    return Request(i, int(source.input_tokens[i]), int(source.output_tokens[i]))


def test_one_replica_built_alone_serves_requests_and_caches_their_prefix() -> None:
    reqs = [Req([(1, 512), (2, 64)], 8), Req([(1, 512), (3, 64)], 8, arrival_s=0.0)]
    parts = _parts(EngineConfig(num_gpu_blocks=200, tiers="hbm,dram"), reqs)
    done: list[Request] = []
    replica = build_replica(parts, 0, "mixed", done.append)
    assert replica.kv.hierarchy is not None and replica.kv.pool.num_blocks == 200
    first = _request(parts, 0)
    replica.submit(first)
    parts.env.run()
    second = _request(parts, 1)
    replica.submit(second)
    parts.env.run()
    assert done == [first, second]
    assert first.generated == second.generated == 8
    assert first.cached_tokens == 0
    assert second.cached_tokens == 512  # the shared 512-token segment: 32 blocks of 16
    assert replica.kv.pool.used == 0  # every block released; cached ones stay evictable


def test_a_cluster_assembled_directly_routes_and_hands_off() -> None:
    reqs = [Req([(i % 3 + 1, 256), (100 + i, 48)], 4, arrival_s=0.0) for i in range(6)]
    parts = _parts(EngineConfig(pd="1:2", router="dynamo-kv"), reqs)
    done: list[Request] = []
    fleet = assemble(parts, done.append)
    assert [r.role for r in fleet.replicas] == ["prefill", "decode", "decode"]
    requests = [_request(parts, i) for i in range(6)]
    for req in requests:
        fleet.cluster.route(req)
    parts.env.run()
    assert sorted(r.index for r in done) == list(range(6))
    assert fleet.cluster.disaggregated + fleet.cluster.local_prefills == 6
    decoded_on = {r.replica for r in requests}
    assert decoded_on <= {1, 2}  # every request ends on a decode replica
    assert fleet.cluster.disaggregated > 0 and any(r.transfer_bytes > 0 for r in requests)

"""Adding a router: one `choose` method, a `Params` dataclass, one `register` call.

The router here, `longest-prefix`, is made up for the example: among the replicas holding the
longest part of a request's prompt, the one with the fewest outstanding tokens (prompt tokens
still to compute, plus the tokens whose KV its admitted requests hold), lowest index on a tie.
Taken strictly it sends all the agentic requests below to one replica: each new session's
longest cached prefix is the shared system prompt, held only where it was first computed. Its
one parameter, `slack_blocks`, lets a replica within that many blocks of the longest count as
holding it, trading hits for balance.

A router never sees the engine. For each request the cluster calls `choose(request, view,
candidates)` (kvsim.routers.base): `request` is a `RouteRequest` (its prompt's block hash
chain, its tokens), `view` the cluster as the router sees it, possibly stale (`--router-refresh-s`):
each replica's `ReplicaLoad` in `view.loads`, how much of the prompt a replica holds and in which
tier in `view.match(replica, request)`, and cost-model estimates (`queue_s`, `prefill_s`,
`load_s`). It returns one of `candidates`. `self.rng` is the run's seeded generator, for routers
that draw; `self.params` the filled `Params`, whose `__post_init__` refuses a value out of range
with `check_param`.

Once registered, the name works wherever a built-in's does, in this process:
`EngineConfig(router="longest-prefix", router_params="longest-prefix.slack_blocks=256")`,
`make_router`. Inside kvsim the class goes in a file of its own under kvsim/routers/ and is added
to the list its `__init__` registers. A package outside kvsim declares it in its pyproject.toml
instead, and then the command line finds it too (or pass `module:Class`):

    [project.entry-points."kvsim.routers"]
    longest-prefix = "my_package.longest_prefix:LongestPrefix"

Run: python examples/extend/router.py
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvsim.engine import EngineConfig
from kvsim.routers import (
    ClusterView,
    ReplicaLoad,
    Router,
    RouteRequest,
    make_router,
    register,
    router_names,
)
from kvsim.routers.base import check_param
from kvsim.run import RunConfig, run


@dataclass(frozen=True)
class LongestPrefixParams:
    slack_blocks: int = 0
    """Blocks short of the longest cached prefix a replica may be and still count (0: exact)."""

    def __post_init__(self) -> None:
        check_param(self.slack_blocks >= 0, "slack_blocks", "must be >= 0")


class LongestPrefix(Router):
    """Fewest outstanding tokens among the replicas holding the longest prefix."""

    name = "longest-prefix"
    Params = LongestPrefixParams

    def choose(self, request: RouteRequest, view: ClusterView, candidates: Sequence[int]) -> int:
        held = {w: view.match(w, request).blocks for w in candidates}  # in any tier
        enough = max(held.values()) - self.params.slack_blocks
        near = [w for w in candidates if held[w] >= enough]
        return min(near, key=lambda w: (outstanding_tokens(view.loads[w], request.block_size), w))


def outstanding_tokens(load: ReplicaLoad, block_size: int) -> int:
    """Prompt tokens still to compute, plus the tokens whose KV the admitted requests hold."""
    return load.prefill_tokens + load.decode_blocks * block_size


register(LongestPrefix)


def main() -> None:
    print("registered:", "longest-prefix" in router_names())
    print("made:", make_router("longest-prefix", {"slack_blocks": 256}).params)
    print("agentic, 200 requests, 4 replicas")
    print(f"{'router':<32} hit ratio  TTFT p50 s  requests per replica")
    for router, params in (
        ("round-robin", ""),
        ("longest-prefix", ""),
        ("longest-prefix", "longest-prefix.slack_blocks=256"),
    ):
        engine = EngineConfig(replicas=4, router=router, router_params=params)
        outcome = run(RunConfig(trace="agentic", max_requests=200, engine=engine))
        served = outcome.result.requests.column("replica").to_pylist()
        s = outcome.summary
        print(f"{params or router:<32} {s['prefix_hit_ratio']:>9.3f}  {s['ttft_p50_s']:>10.3f}  "
              f"{' '.join(str(served.count(w)) for w in range(4))}")  # fmt: skip


if __name__ == "__main__":
    main()

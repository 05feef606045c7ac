"""Adding an eviction policy: a priority, a `Params` dataclass, one `register` call.

The policy here, `depth-lru`, is made up for the example. It is LRU, except that a block deep in
a prompt looks older than it is: its priority is its last touch minus `seconds_per_block` for
each block before it in its prompt, and the lowest priority is evicted first. Among blocks
touched at about the same time a prompt's tail goes first, and its head (the system prompt and
tool definitions an agent's calls share) stays. At 0 seconds per block it is LRU, hit for hit.

A policy only orders the evictable blocks of one tier; the tier owns capacity, pinning and
counters, and tells the policy what happens (kvsim.policies.base): `add` (a block became
evictable), `access` (a hit), `discard` (no longer evictable), `forget` (left the tier) and
`victim` (which to evict next; choosing does not evict). When the order is a priority,
`PriorityPolicy` keeps the heap: a subclass pushes a block's priority when it is added or hit,
and the base does the rest. `BlockInfo` says what a policy may know of a block: the simulated
time, its position in the prompt, its parent, its segment kind, its size.

`Params` is a dataclass of the policy's parameters with their defaults;
`policy_params="depth-lru.seconds_per_block=2"` (`--policy-param` on the command line) fills it,
checking each value's type. Once registered, the name works wherever a built-in's does, in this
process: `EngineConfig(policy="depth-lru")`, one per tier (`"hbm=depth-lru,dram=lru"`),
`make_policy`. Inside kvsim the class goes in a file of its own under kvsim/policies/ and is
added to the list its `__init__` registers. A package outside kvsim declares it in its
pyproject.toml instead, and then the command line finds it too (or pass `module:Class`):

    [project.entry-points."kvsim.policies"]
    depth-lru = "my_package.depth_lru:DepthLRU"

Run: python examples/extend/policy.py
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine import EngineConfig
from kvsim.errors import ConfigError
from kvsim.policies import BlockInfo, make_policy, policy_names, register
from kvsim.policies.priority import PriorityPolicy
from kvsim.run import RunConfig, run


@dataclass(frozen=True)
class DepthLRUParams:
    seconds_per_block: float = 1.0
    """How much older each earlier block of its prompt makes a block look (our assumption)."""

    def __post_init__(self) -> None:
        if self.seconds_per_block < 0:
            raise ConfigError(f"seconds_per_block must be >= 0, got {self.seconds_per_block}")


class DepthLRU(PriorityPolicy):
    name = "depth-lru"
    Params = DepthLRUParams

    def __init__(self, params: DepthLRUParams | None = None) -> None:
        super().__init__()
        self.params = params or DepthLRUParams()

    def add(self, key: int, info: BlockInfo) -> None:
        self._push(key, info.now_s - self.params.seconds_per_block * info.position)

    def access(self, key: int, info: BlockInfo) -> None:
        if key in self._live:  # a hit on a pinned block reorders nothing: it is not evictable
            self.add(key, info)


register(DepthLRU)


def main() -> None:
    print("registered:", "depth-lru" in policy_names())
    print("made:", make_policy("depth-lru", {"seconds_per_block": 2}).params)
    # A small HBM and a small DRAM tier (16 GB per node, shared by its 8 GPUs), so that both
    # tiers evict and their order matters.
    print("agentic, 100 requests, 1,024 HBM blocks, DRAM 16GB per node")
    print(f"{'policy':<30} hit ratio  from HBM  from DRAM  TTFT p50 s")
    for policy, params in (
        ("lru", ""),
        ("depth-lru", ""),  # the default, 1 s per block
        ("depth-lru", "depth-lru.seconds_per_block=0"),  # LRU again
    ):
        engine = EngineConfig(policy=policy, policy_params=params, num_gpu_blocks=1024,
                              tiers="hbm,dram", tier_capacity="dram=16GB")  # fmt: skip
        s = run(RunConfig(trace="agentic", max_requests=100, engine=engine)).summary
        by_tier = s["hit_ratio_by_tier"]  # where the hits were served from
        print(f"{params or policy:<30} {s['prefix_hit_ratio']:>9.3f}  {by_tier['hbm']:>8.3f}  "
              f"{by_tier['dram']:>9.3f}  {s['ttft_p50_s']:>10.3f}")  # fmt: skip


if __name__ == "__main__":
    main()

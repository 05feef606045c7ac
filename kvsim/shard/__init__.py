"""Time-sharded runs: one run split into consecutive windows simulated in parallel."""

from kvsim.shard.run import Sharding, run_sharded, run_split
from kvsim.shard.windows import windows

__all__ = ["Sharding", "run_sharded", "run_split", "windows"]

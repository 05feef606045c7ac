"""Throughput of `kvsim mrc` replay against libCacheSim's Python binding, same sequence, same run.

Reports block accesses per second; asserts nothing (DESIGN: benchmarks report figures).
Usage: python benchmarks/bench_mrc.py [trace] [capacity]
"""

from __future__ import annotations

import sys
import time

from kvsim.mrc import BlockSequence, replay
from kvsim.policies import make_policy, policy_names
from kvsim.traces import load_trace


def main(trace: str = "mooncake-conversation", capacity: int = 10_000) -> None:
    loaded = load_trace(trace)
    seq = BlockSequence.from_trace(loaded, loaded.native_block_size or 16)
    keys = seq.keys.tolist()
    n = len(keys)
    print(f"{trace}: {n} block accesses, capacity {capacity} blocks")
    try:
        import libcachesim as lcs

        cache = lcs.LRU(capacity)
        start = time.perf_counter()
        hits = 0
        for key in keys:  # request by request, as a Python user drives it
            req = lcs.Request()
            req.obj_id = key >> 1
            req.obj_size = 1
            hits += cache.get(req)
        lcs_rate = n / (time.perf_counter() - start)
        print(f"{'libcachesim LRU':<24} {lcs_rate:>12,.0f} accesses/s  hits {hits}")
    except ImportError:
        lcs_rate = float("nan")
    for name in policy_names():
        if name.startswith("example-"):
            continue
        start = time.perf_counter()
        result = replay(seq, make_policy(name), capacity, "plain")
        rate = n / (time.perf_counter() - start)
        print(
            f"kvsim {name:<18} {rate:>12,.0f} accesses/s  hits {result.hits}  "
            f"({rate / lcs_rate:.2f}x libcachesim LRU)"
        )


if __name__ == "__main__":
    main(*(sys.argv[1:2]), *(int(a) for a in sys.argv[2:3]))

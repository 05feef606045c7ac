"""What one block-table lookup costs as the table grows: why quant's larger tables slow the engine.

    python benchmarks/dict_lookup_latency.py

The engine keeps its KV blocks in dicts (the HBM pool's reference counts, each tier's placement
map and eviction queue). A compression profile with 3.2x smaller pages gives these tables 3.2x
the entries. This measures a lookup (``dict.get`` over a list of keys, the C-level pass the
engine makes) in a dict of random 64-bit keys, as the engine's block hashes were, at the table
sizes of the default mooncake-conversation run: in random order (blocks the scheduler touches
across requests) and in insertion order (one request's chain, registered together). The second
is why the engine now keys its tables by dense ids numbered by first appearance
(kvsim.traces.blocks.first_seen_ids): a chain's ids are consecutive, so its lookups land in
neighbouring slots. Asserts nothing: the figures go
in docs/compression.md ("Does compression slow the engine?").
"""

from __future__ import annotations

import random
import time

# llama-3.1-8b on one H100 with its DRAM tier (the defaults): HBM blocks and DRAM blocks
SIZES = {
    "none, HBM pool": 25_650,
    "quant 4/4, HBM pool": 82_080,
    "none, DRAM tier": 119_209,
    "quant 4/4, DRAM tier": 381_469,
}


def lookup_ns(size: int, shuffled: bool, repeats: int = 5) -> float:
    """Best-of-`repeats` nanoseconds per lookup in a dict of `size` random 64-bit keys."""
    rng = random.Random(size)
    keys = [rng.getrandbits(64) for _ in range(size)]
    table = dict.fromkeys(keys, 0)
    order = keys[:]
    if shuffled:
        rng.shuffle(order)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        list(map(table.get, order))
        best = min(best, time.perf_counter() - start)
    return best / size * 1e9


def main() -> None:
    print("table | entries | ns per lookup, random order | ns per lookup, insertion order")
    for name, size in SIZES.items():
        print(f"{name} | {size:,} | {lookup_ns(size, True):.0f} | {lookup_ns(size, False):.0f}")


if __name__ == "__main__":
    main()

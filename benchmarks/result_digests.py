"""Digests of the results of many runs, to show that a change of structure changed no result.

Each case is a `RunConfig` covering one feature of the engine (every built-in trace at its
default run, every policy, compression profile and router, P/D, shared tiers, load overlap,
the scheduler's modes). A case's digest covers its requests table (every column, every value)
and its summary (every key but wall-clock times), so two commits whose digests match produced the
same results bit for bit.

    python benchmarks/result_digests.py --out before.json          # on the old commit
    python benchmarks/result_digests.py --compare before.json      # on the new one

`--quick` runs a subset (seconds rather than minutes); `--only SUBSTRING` the matching cases.
Runs with `--jobs N` processes (default: the machine's cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np


def _cases() -> dict[str, Any]:
    from kvsim.engine import EngineConfig
    from kvsim.policies import builtin_policy_names
    from kvsim.routers import builtin_router_names
    from kvsim.run import RunConfig
    from kvsim.traces.registry import _LOADERS

    def cfg(trace: str = "sharegpt", n: int | None = 300, **engine: Any) -> RunConfig:
        return RunConfig(trace=trace, max_requests=n, engine=EngineConfig(**engine))

    cases: dict[str, Any] = {}
    for trace in sorted(_LOADERS):  # every built-in trace at its default run
        cases[f"default/{trace}"] = RunConfig(trace=trace)
    small = {"num_gpu_blocks": 1500, "tiers": "hbm,dram"}
    for policy in builtin_policy_names():
        cases[f"policy/{policy}"] = cfg("mooncake-conversation", 400, policy=policy, **small)
    cases["policy/ema-head-granular"] = cfg(
        "mooncake-conversation",
        400,
        policy="ema-head",
        policy_params="ema-head.head_granular=true",
        **small,
    )
    cases["policy/per-tier"] = cfg(
        "agentic", 300, policy="hbm=belady,dram=arc", tiers="hbm,dram,nvme,rdma"
    )
    for comp in (
        "quant:k=4,v=4",
        "quant:k=8,v=8",
        "h2o",
        "streaming",
        "snapkv",
        "lkv",
        "kvp",
        "moe-nd:budget=0.25",
        "infinigen",
        "auto",
    ):
        cases[f"compression/{comp}"] = cfg("mooncake-conversation", 200, compression=comp)
    cases["compression/auto-belady"] = cfg(
        "mooncake-conversation", 200, compression="auto", policy="belady"
    )
    cases["compression/snapkv-70b"] = dataclasses.replace(
        cfg("sharegpt", 200, compression="snapkv", tp=4), model="llama-3.1-70b"
    )
    cases["model/gemma-window"] = dataclasses.replace(cfg("sharegpt", 200), model="gemma-2-27b")
    cases["model/deepseek-mla"] = dataclasses.replace(
        cfg("sharegpt", 100, tp=8), model="deepseek-v3", hardware="h200-sxm"
    )
    cases["model/jamba-hybrid"] = dataclasses.replace(
        cfg("sharegpt", 150, tp=2), model="jamba-v0.1"
    )
    for router in builtin_router_names():
        cases[f"router/{router}"] = cfg("sharegpt", 400, replicas=4, router=router)
    cases["router/llm-d-refresh"] = cfg(
        "sharegpt", 400, replicas=4, router="llm-d", router_refresh_s=0.5
    )
    cases["router/dynamo-shared-rdma"] = cfg(
        "agentic", 300, replicas=4, router="dynamo-kv", tiers="hbm,dram,rdma"
    )
    cases["pd/2:2"] = cfg("sharegpt", 300, pd="2:2", router="dynamo-kv")
    cases["pd/1:3-threshold"] = cfg("sharegpt", 300, pd="1:3", pd_threshold=256)
    for overlap in ("layerwise", "bidirectional"):
        cases[f"overlap/{overlap}"] = cfg(
            "mooncake-conversation", 300, load_overlap=overlap, **small
        )
    cases["tiers/all"] = cfg("agentic", 300, tiers="all", num_gpu_blocks=1200)
    cases["tiers/exclusive-second-chance"] = cfg(
        "mooncake-conversation",
        300,
        hierarchy="exclusive",
        admission="second-chance",
        num_gpu_blocks=1200,
        tiers="hbm,dram,nvme",
    )
    cases["tiers/write-through"] = cfg(
        "mooncake-conversation", 300, write_policy="write-through", **small
    )
    cases["tiers/no-prefetch"] = cfg("agentic", 300, prefetch=False, **small)
    cases["sched/rope-reuse"] = cfg("agentic", 300, rope_reuse=True)
    cases["sched/full-reservation"] = cfg("sharegpt", 300, kv_reservation="full")
    cases["sched/no-chunked-prefill"] = cfg("sharegpt", 300, chunked_prefill=False)
    cases["sched/multi-step"] = cfg("sharegpt", 300, num_scheduler_steps=8)
    cases["sched/no-coalesce"] = cfg("sharegpt", 200, coalesce_decode=False)
    cases["sched/no-prefix-caching"] = cfg("sharegpt", 200, enable_prefix_caching=False)
    cases["sched/preempting"] = cfg("sharegpt", 300, num_gpu_blocks=600, max_num_seqs=64)
    cases["sched/fp8-kv"] = cfg("sharegpt", 200, kv_dtype="fp8")
    return cases


QUICK = (
    "default/sharegpt",
    "policy/lru",
    "policy/belady",
    "policy/ema-head-granular",
    "compression/quant:k=4,v=4",
    "compression/h2o",
    "compression/infinigen",
    "compression/auto",
    "router/dynamo-kv",
    "router/llm-d-refresh",
    "pd/2:2",
    "overlap/layerwise",
    "tiers/all",
    "sched/multi-step",
    "sched/preempting",
)


def table_digest(table: Any) -> str:
    h = hashlib.sha256()
    for name in table.column_names:
        col = table.column(name).to_numpy(zero_copy_only=False)
        h.update(name.encode())
        h.update(np.ascontiguousarray(col.astype(str) if col.dtype == object else col).tobytes())
    return h.hexdigest()[:16]


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if "wall" not in k}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def digest_case(name: str) -> tuple[str, str]:
    from kvsim.run import json_safe, run

    try:
        outcome = run(_cases()[name])
    except Exception as exc:  # an error is a result too: it must not change either
        return name, f"error: {type(exc).__name__}: {exc}"
    summary = json.dumps(json_safe(_clean(outcome.summary)), sort_keys=True, default=str)
    result = outcome.result
    tables = table_digest(result.requests_with_compression())
    if result.timeline is not None:
        tables += "-" + table_digest(result.timeline)
    return name, tables + "-" + hashlib.sha256(summary.encode()).hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digests to this JSON file")
    parser.add_argument("--compare", help="compare with the digests in this JSON file")
    parser.add_argument("--quick", action="store_true", help="a subset of the cases")
    parser.add_argument("--only", default="", help="only cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    names = [n for n in (QUICK if args.quick else _cases()) if args.only in n]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        digests = dict(pool.map(digest_case, names))
    print(f"{len(digests)} cases in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(digests, f, indent=1, sort_keys=True)
    if not args.compare:
        for name, d in digests.items():
            print(f"{name:40s} {d}")
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    differ = [n for n in names if n in before and before[n] != digests[n]]
    missing = [n for n in names if n not in before]
    parts = ("requests", "timeline", "summary")
    for n in differ:
        old, new = before[n].split("-"), digests[n].split("-")
        which = [p for p, x, y in zip(parts, old, new, strict=False) if x != y]
        print(f"DIFFERS {n} ({', '.join(which) or 'error'}): {before[n]} -> {digests[n]}")
    for n in missing:
        print(f"NEW     {n}: {digests[n]}")
    print(f"{len(names) - len(differ) - len(missing)} identical, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

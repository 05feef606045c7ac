"""kvsim's engine-named policies against the engines' own cache code, request for request.

Replays a trace one request at a time at 512-token blocks (prefix semantics) through kvsim's
`vllm`, `radix-lru` and `sglang` policies and, when they can be imported, through vLLM v1's own
KVCacheManager (vllm/v1/core) and SGLang's own RadixCache (sglang/srt/mem_cache), driven the way
their schedulers drive them:

- vLLM: ``get_computed_blocks`` (hit capped at input - 1 tokens), ``allocate_slots`` for the
  rest of the prompt (which caches its full blocks), ``free`` (tail first). The pool gets
  capacity + 1 blocks: vLLM reserves one as its null block.
- SGLang: ``match_prefix`` on the first input - 1 tokens (page-aligned), ``inc_lock_ref``,
  eviction of the shortfall as ``evict_from_tree_cache`` does for a paged extend (the
  request's new tokens plus one page, minus what is free), the allocation, then
  ``cache_finished_req``'s steps: insert the page-aligned prompt, free the duplicates and the
  unaligned tail, ``dec_lock_ref``. A counting allocator stands in for the GPU pool.

Token ids are made from kvsim's block hashes, so two prompts share a block in the engines
exactly when they do in kvsim. Never install the engines in the project's environment; use a
scratch one (docs/validation.md says how). Prints a Markdown table; asserts nothing.

Usage: python benchmarks/validate_cache_semantics.py [trace] [capacities] [--max-requests N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import time
from collections.abc import Callable

import numpy as np

from kvsim.mrc import BlockSequence, replay
from kvsim.policies import make_policy
from kvsim.traces import load_trace

BLOCK = 512
KVSIM_POLICIES = ("vllm", "radix-lru", "sglang")


def _prompts(seq: BlockSequence) -> list[list[int]]:
    """Token ids per request: each full block from its kvsim hash, the partial tail zeros."""
    out = []
    tokens = seq.prompt_tokens().tolist()
    keys = seq.keys.tolist()
    offsets = seq.offsets.tolist()
    for row, n in enumerate(tokens):
        ids: list[int] = []
        for key in keys[offsets[row] : offsets[row + 1]]:
            ids += [key >> 42, (key >> 21) & 0x1FFFFF, key & 0x1FFFFF] + [1] * (BLOCK - 3)
        ids += [0] * (n - len(ids))
        out.append(ids)
    return out


def vllm_hits(prompts: list[list[int]], capacity: int) -> list[int]:
    """Per-request hit blocks from vLLM v1's own KVCacheManager."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(
        num_blocks=capacity + 1,  # one is vLLM's null block
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    longest = max(len(p) for p in prompts) + BLOCK
    manager = KVCacheManager(config, longest, BLOCK, BLOCK, enable_caching=True)
    hasher = get_request_block_hasher(BLOCK, sha256)
    params = SamplingParams(max_tokens=1)
    hits = []
    for i, ids in enumerate(prompts):
        req = Request(str(i), ids, params, None, block_hasher=hasher)
        if -(-len(ids) // BLOCK) > capacity:
            hits.append(0)  # can never be scheduled
            continue
        blocks, computed = manager.get_computed_blocks(req)[:2]
        new = manager.allocate_slots(req, len(ids) - computed, computed, blocks)
        assert new is not None, f"request {i}: vLLM could not allocate"
        req.num_computed_tokens = len(ids)
        manager.free(req)
        hits.append(computed // BLOCK)
    return hits


class _CountingAllocator:
    """The token pool SGLang's radix cache frees into: only its free count matters here."""

    def __init__(self, tokens: int) -> None:
        self.free_tokens = tokens
        self.page_size = BLOCK
        self.device = "cpu"

    def available_size(self) -> int:
        return self.free_tokens

    def alloc(self, n: int):  # type: ignore[no-untyped-def]
        import torch

        if n > self.free_tokens:
            return None
        self.free_tokens -= n
        return torch.zeros(n, dtype=torch.int64)

    def free(self, indices) -> None:  # type: ignore[no-untyped-def]
        self.free_tokens += len(indices)

    def free_segment(self, indices, start_pos: int = 0) -> None:  # type: ignore[no-untyped-def]
        self.free(indices)


def sglang_hits(prompts: list[list[int]], capacity: int) -> list[int]:
    """Per-request hit pages from SGLang's own RadixCache (page size 512, LRU)."""
    import torch
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    allocator = _CountingAllocator(capacity * BLOCK)
    cache = RadixCache.create_simulated(mock_allocator=allocator, page_size=BLOCK)
    params = _SGLangParams()
    hits = []
    for ids in prompts:
        pages = -(-len(ids) // BLOCK)
        if pages > capacity:
            hits.append(0)
            continue
        key = RadixKey(ids[: len(ids) - 1])  # the scheduler's max_prefix_len = input - 1
        match = cache.match_prefix(params.match(key))
        prefix = getattr(match, "device_prefix_len", None)
        if prefix is None:
            prefix = len(match.device_indices)
        node = match.last_device_node
        cache.inc_lock_ref(node)
        extend = pages * BLOCK - prefix
        need = extend + BLOCK  # the paged extend over-estimates one page per request
        if allocator.available_size() < need:
            evict = getattr(cache, "evict_for_alloc", cache.evict)
            evict(params.evict(need - allocator.available_size()))
        assert allocator.alloc(extend) is not None, "SGLang could not allocate"
        aligned = len(ids) // BLOCK * BLOCK
        values = torch.zeros(pages * BLOCK, dtype=torch.int64)  # only counts matter here
        done = cache.insert(params.insert(RadixKey(ids[:aligned]), values[:aligned]))
        allocator.free(values[prefix : _prefix_len(done)])  # duplicates already in the tree
        allocator.free(values[aligned:])  # the unaligned tail
        cache.dec_lock_ref(node)
        hits.append(prefix // BLOCK)
    return hits


def _prefix_len(result: object) -> int:
    return int(getattr(result, "prefix_len", result))  # type: ignore[arg-type]


class _SGLangParams:
    """SGLang's call parameters: dataclasses in recent releases, plain values before."""

    def __init__(self) -> None:
        from sglang.srt.mem_cache import base_prefix_cache as base

        self.base = base

    def match(self, key):  # type: ignore[no-untyped-def]
        cls = getattr(self.base, "MatchPrefixParams", None)
        return cls(key=key) if cls else key

    def evict(self, tokens: int):  # type: ignore[no-untyped-def]
        cls = getattr(self.base, "EvictParams", None)
        return cls(num_tokens=tokens) if cls else tokens

    def insert(self, key, value):  # type: ignore[no-untyped-def]
        cls = getattr(self.base, "InsertParams", None)
        return cls(key=key, value=value) if cls else (key, value)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="mooncake-conversation")
    parser.add_argument("capacities", nargs="?", default="1000,4000,10000,50000")
    parser.add_argument("--max-requests", type=int, default=None)
    args = parser.parse_args()
    capacities = [int(c) for c in args.capacities.split(",")]
    seq = BlockSequence.from_trace(load_trace(args.trace, max_requests=args.max_requests), BLOCK)
    requests = len(seq.offsets) - 1
    print(f"{args.trace}: {requests} requests, {seq.keys.size} full blocks of {BLOCK} tokens")
    prompts = _prompts(seq)
    engines: dict[str, Callable[[list[list[int]], int], list[int]]] = {}
    for name, dist, fn in (("vLLM", "vllm", vllm_hits), ("SGLang", "sglang", sglang_hits)):
        try:
            fn(prompts[:3], 4)
        except ImportError as exc:
            print(f"{name}: unavailable ({exc}); install it in a scratch environment")
            continue
        engines[name] = fn
        print(f"{name} {_version(dist)}: its own cache code")
    columns = [f"kvsim {p}" for p in KVSIM_POLICIES] + list(engines)
    rows: dict[int, dict[str, np.ndarray]] = {}
    for capacity in capacities:
        row: dict[str, np.ndarray] = {}
        for policy in KVSIM_POLICIES:
            start = time.perf_counter()
            result = replay(seq, make_policy(policy), capacity, "prefix")
            assert result.request_hits is not None
            row[f"kvsim {policy}"] = result.request_hits
            print(f"  {policy} at {capacity}: {time.perf_counter() - start:.1f} s")
        for name, fn in engines.items():
            start = time.perf_counter()
            row[name] = np.array(fn(prompts, capacity))
            print(f"  {name} at {capacity}: {time.perf_counter() - start:.1f} s")
        rows[capacity] = row
    print()
    print("| blocks | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    for capacity, row in rows.items():
        print(f"| {capacity:,} | " + " | ".join(f"{int(row[c].sum()):,}" for c in columns) + " |")
    pairs = [("kvsim vllm", "vLLM"), ("kvsim radix-lru", "vLLM"), ("kvsim sglang", "SGLang")]
    pairs = [(a, b) for a, b in pairs if b in engines]
    if pairs:
        print()
        print("| blocks | pair | hits differing | requests differing |")
        print("|---:|---|---:|---:|")
        for capacity, row in rows.items():
            for a, b in pairs:
                diff = row[a] - row[b]
                print(
                    f"| {capacity:,} | {a} vs {b} | {int(diff.sum()):+,} "
                    f"({int(np.abs(diff).sum()):,} abs) | {int(np.count_nonzero(diff))} |"
                )


if __name__ == "__main__":
    main()

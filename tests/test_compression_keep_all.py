"""Profiles told to keep every token (issue 25): they run, and hold what an uncompressed run holds.

Every token-dropping profile is compacted after prefill. A request that drops nothing used to
unpin its cached pages and take as many fresh ones back; when another running request shared
those pages the pool had nothing to give and the run ended in "AssertionError: compaction could
not take back pages it had just released". Such a request now keeps its pages where they are, and
one that does drop tokens keeps its hits pinned when the pool cannot give it pages.
"""

from __future__ import annotations

import pytest
from helpers import unless_compiled

from kvsim.compression import bytes_per_kept_token, compressed_kv_bytes, parse_compression
from kvsim.engine import EngineConfig
from kvsim.kvcache.manager import KVCacheManager
from kvsim.models import load_model
from kvsim.run import RunConfig, run

#: Every request under pressure: 50 mooncake-conversation requests (many multi-turn, so pages are
#: shared between running requests) on 4,000 pages, where each of these used to crash.
SMALL = {"num_gpu_blocks": 4000, "tiers": "hbm,dram"}

KEEP_ALL = (
    "streaming:window=1000000",  # a window longer than any prompt
    "h2o:budget=1.0",
    "h2o:budget=1000000",
    "lkv:ratio=1.0",
    "kvp:budget=1.0",
    "snapkv:capacity=1000000",
    "moe-nd:budget=0.9",  # the solver keeps every token and quantises some layers
    "moe-nd:layers=1.0x16x16",  # a one-entry table applies to every layer
)


def _run(compression: str, trace: str = "mooncake-conversation", n: int = 50, **engine):
    engine_config = EngineConfig(compression=compression, **engine)
    return run(RunConfig(trace=trace, max_requests=n, engine=engine_config))


@pytest.fixture(scope="module")
def none_statuses() -> list[str]:
    return _run("none", **SMALL).result.requests.column("status").to_pylist()


@pytest.mark.parametrize("text", KEEP_ALL)
def test_a_keep_everything_profile_completes_every_request(text, none_statuses):
    statuses = _run(text, **SMALL).result.requests.column("status").to_pylist()
    # the one request whose 87k-token prompt exceeds the 64k tokens of the pool is rejected,
    # as it is without compression; every other request completes
    assert statuses == none_statuses
    assert statuses.count("completed") == len(statuses) - 1


def test_a_one_entry_moe_nd_table_applies_to_every_layer(tmp_path):
    llama = load_model("llama-3.1-8b")  # 32 KV layers
    table = tmp_path / "one.csv"
    table.write_text("layer,keep,kbits,vbits\n0,1.0,4,4\n")
    one = parse_compression(f"moe-nd:table={table}")
    assert one == parse_compression("moe-nd:layers=1.0x4x4")
    every = parse_compression("moe-nd:layers=1.0x4x4*32")
    quant = parse_compression("quant:k=4,v=4,residual=0")
    assert bytes_per_kept_token(llama, one) == bytes_per_kept_token(llama, every) == 40_960
    assert bytes_per_kept_token(llama, quant) == 40_960
    for n, g in ((0, 0), (1000, 0), (5000, 300)):
        got = compressed_kv_bytes(llama, one, n, generated_tokens=g)
        assert got == compressed_kv_bytes(llama, every, n, generated_tokens=g) == n * 40_960
        assert one.kept_tokens(n, None, g) == one.kept_tokens(n, 7, g) == n


@pytest.mark.parametrize("text", ["streaming:window=1000000", "moe-nd:layers=1.0x16x16"])
def test_keeping_everything_at_the_base_width_holds_what_none_holds(text):
    # no work and pages of none's size: the run is none's, KV held and cache hits included
    # (sharegpt on 800 pages: before the fix, duplicated pages changed evictions and hits)
    engine = {"num_gpu_blocks": 800, "tiers": "hbm,dram"}
    plain = _run("none", "sharegpt", 300, **engine)
    kept = _run(text, "sharegpt", 300, **engine)
    a = plain.result.requests_with_compression().drop_columns(["compression"])
    b = kept.result.requests_with_compression().drop_columns(["compression"])
    assert a.equals(b)
    skip = {"compression", "quality", "wall_s"}
    assert {k: v for k, v in plain.summary.items() if k not in skip} == {
        k: v for k, v in kept.summary.items() if k not in skip
    }


@unless_compiled("kvsim.kvcache.manager")  # and a BlockPool method, which it does not allow
def test_a_dropping_request_keeps_its_hits_when_the_pool_cannot_give_pages(monkeypatch):
    # default streaming: a prompt inside its 2,004 tokens whose reply will pass them drops
    # nothing yet, but is compacted; its hits, pinned by other requests too, cannot be traded
    # for fresh pages on a full pool, so it keeps them pinned (the path that used to assert)
    fallbacks = []
    compact = KVCacheManager.compact

    def checked(self, req, now_s):
        pool = self.pool
        allocate = pool.allocate

        def counted(count):
            ok = allocate(count)
            fallbacks.extend([] if ok else [count])
            return ok

        pool.allocate = counted
        try:
            compact(self, req, now_s)
        finally:
            del pool.allocate
        pool.check()  # no page lost or counted twice
        assert req.table.held_blocks >= len(req.table.held_cached)

    monkeypatch.setattr(KVCacheManager, "compact", checked)
    result = _run("streaming", n=120, num_gpu_blocks=800, tiers="hbm,dram").result
    assert fallbacks  # the path was taken
    statuses = set(result.requests.column("status").to_pylist())
    assert statuses <= {"completed", "rejected"}

"""Head-granular freeing in the engine (issue 14): the GroupPool behind the KV-cache manager frees
KV-head groups as kvsim mrc's independent replay (kvsim.mrc.heads) does, never loses or
duplicates a group slot, and a run records what its lossy hits cost."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kvcache import BlockPool
from kvsim.kvcache.group_pool import GroupPool
from kvsim.kvcache.request import Request
from kvsim.mrc import BlockSequence, replay
from kvsim.mrc.heads import replay_heads
from kvsim.mrc.replay import cache_only_manager
from kvsim.policies import make_policy
from kvsim.policies.ema_head import EmaHead, EmaHeadParams
from kvsim.traces import KIND_CODES

BLOCK = 16


def _stream(seed: int, requests: int = 40) -> BlockSequence:
    """Requests sharing a few long prefixes (documents) then a private tail, a few seconds
    apart, with prompts that end inside a block: deep and shallow blocks of the same chain
    compete, so which groups go first decides what later requests hit."""
    rng = random.Random(seed)
    docs = [[1000 * (d + 1) + i for i in range(rng.randint(3, 7))] for d in range(4)]
    chains, times, tokens, now, fresh = [], [], [], 0.0, 10**6
    for _ in range(requests):
        doc = rng.choice(docs)
        chain = doc[: rng.randint(1, len(doc))]
        for _ in range(rng.randint(0, 3)):
            fresh += 1
            chain = [*chain, fresh]
        chains.append(chain)
        now += rng.choice((0.5, 1.0, 2.0, 4.0))
        times.append(now)
        tokens.append(BLOCK * len(chain) + rng.randint(0, BLOCK - 1))
    keys = [k for chain in chains for k in chain]
    return BlockSequence(
        np.cumsum([0] + [len(c) for c in chains]).astype(np.int64),
        np.array(keys, dtype=np.uint64),
        np.full(len(keys), KIND_CODES["user"], dtype=np.uint8),
        np.array(times),
        BLOCK,
        np.array(tokens, dtype=np.int64),
    )


def _engine(seq: BlockSequence, policy: EmaHead, capacity: int) -> tuple[int, int, float, int]:
    """(hits, lossy hits, attention mass lost, unserved) with each request, one at a time,
    through the engine's KV-cache manager over the pool the engine builds for `policy` (as
    kvsim mrc --semantics prefix drives it, kvsim.mrc.replay._replay_prefix)."""
    pool_kind = GroupPool if policy.head_groups() > 1 else BlockPool
    pool = pool_kind(capacity, policy)
    offsets, keys = seq.offsets.tolist(), seq.keys.tolist()
    chain: list[int] = []

    def load_chain(req: Request) -> None:
        req.table.hashes = chain
        req.table.kinds = seq.kinds[offsets[req.index] : offsets[req.index + 1]]

    kv = cache_only_manager(seq, pool, load_chain)
    hits = lossy = unserved = 0
    lost = 0.0
    prompts, arrivals = seq.prompt_tokens().tolist(), seq.arrival_s.tolist()
    for row, (tokens, now) in enumerate(zip(prompts, arrivals, strict=True)):
        chain = keys[offsets[row] : offsets[row + 1]]
        req = Request(row, tokens, 0)
        plan = kv.lookup(req, 1 << 62)
        if plan[0] + plan[4] > capacity:
            unserved += 1
            continue
        kv.admit(req, plan, now, True)
        req.computed = req.known
        kv.commit(req, now)
        kv.free(req, now)
        pool.check()
        hits += plan[0]
        lossy += req.lossy_hits
        lost += req.attention_mass_lost
    return hits, lossy, lost, unserved


def _head_policy(tolerate: float) -> EmaHead:
    return EmaHead(EmaHeadParams(head_granular=True, tolerate_loss=tolerate))


def test_engine_equals_mrc_head_replay_where_the_order_matters() -> None:
    differs = lossy_seen = 0
    for seed in range(12):
        seq = _stream(seed)
        for capacity in (9, 14, 20):
            for tolerate in (0.0, 0.002, 0.02):
                ref = replay_heads(seq, _head_policy(tolerate), capacity, "prefix")
                hits, lossy, lost, unserved = _engine(seq, _head_policy(tolerate), capacity)
                assert ref.extra is not None
                assert (hits, lossy, unserved) == (
                    ref.hits,
                    ref.extra["lossy_hits"],
                    ref.extra["unserved_requests"],
                ), (seed, capacity, tolerate)
                requests = len(seq.offsets) - 1
                assert abs(lost / requests - ref.extra["attention_mass_lost"]) < 1e-12
                lossy_seen += lossy > 0
                # kvsim mrc's head-granular prefix replay is this one
                via_mrc = replay(seq, _head_policy(tolerate), capacity, "prefix")
                assert via_mrc.hits == ref.hits
                # the same stream freeing whole blocks hits differently: order matters here
                whole = EmaHead(EmaHeadParams(head_granular=False, tolerate_loss=tolerate))
                differs += _engine(seq, whole, capacity)[0] != hits
    assert differs >= 10 and lossy_seen >= 5, (differs, lossy_seen)


def test_whole_block_is_still_the_engine_default() -> None:
    assert make_policy("ema-head").head_groups() == 1
    assert make_policy("ema-head", {"head_granular": True}).head_groups() == 4
    assert make_policy("ema-head", {"head_granular": False}).head_groups() == 1
    assert BlockPool.head_granular is False and GroupPool.head_granular is True


_OPS = st.lists(
    st.tuples(st.sampled_from(("start", "commit", "finish")), st.integers(0, 7), st.integers(1, 6)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS, capacity=st.integers(3, 12), tolerate=st.sampled_from((0.0, 0.01, 1.0)))
def test_group_slots_are_never_over_capacity_lost_or_duplicated(
    ops: list[tuple[str, int, int]], capacity: int, tolerate: float
) -> None:
    """Requests overlap in time (several pinned at once) over prefixes of a few chains."""
    pool = GroupPool(capacity, _head_policy(tolerate))
    groups = pool.groups
    chains = [[100 * c + i for i in range(1, 7)] for c in range(3)]
    # request id -> (its chain, cached positions it holds, blocks it holds, blocks registered)
    running: dict[int, tuple[list[int], list[int], int, int]] = {}
    now = 0.0
    for op, rid, length in ops:
        now += 1.0
        if op == "start" and rid not in running:
            chain = chains[rid % 3][:length]
            pool.describe(None, BLOCK * length + 1)
            hit, pinned = pool.cached_prefix(chain, length)
            need = length + 1 - hit  # the partial last block too
            if need + pinned > pool.available:
                continue
            before = pool.available
            pool.acquire(chain, hit, now)
            assert pool.available == before - pinned
            assert pool.allocate(need)
            running[rid] = (chain, list(range(hit)), hit + need, hit)
        elif op == "commit" and rid in running:
            chain, cached, held, done = running[rid]
            pool.describe(None, BLOCK * len(chain) + 1)
            cached = cached + pool.register(chain, done, len(chain), now)
            running[rid] = (chain, cached, held, len(chain))
        elif op == "finish" and rid in running:
            chain, cached, held, _ = running.pop(rid)
            pool.describe(None, BLOCK * len(chain) + 1)
            pool.release(chain, cached, held - len(cached), now)
        pool.check()
        # every slot is free, evictable, pinned by a running request, or held uncached by one
        pinned_slots = sum(m.bit_count() for k, m in pool.masks.items() if pool.refs[k])
        uncached = sum((held - len(cached)) * groups for _, cached, held, _ in running.values())
        total = pool.free_slots + pool.evictable_slots + pinned_slots + uncached
        assert total == capacity * groups
    for rid in list(running):
        chain, cached, held, _ = running.pop(rid)
        pool.release(chain, cached, held - len(cached), now)
    pool.check()
    assert pool.available == capacity and pool.used == 0


@pytest.mark.parametrize(
    "tiers", [["--tiers", "hbm"], ["--tiers", "hbm,dram", "--hierarchy", "exclusive"]]
)
def test_run_writes_lossy_hits_and_attention_mass_lost(tmp_path: Path, tiers: list[str]) -> None:
    """With DRAM below, blocks losing their first group are written down whole and loaded back."""
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "kvsim",
        "run",
        "--trace",
        "agentic",
        "--max-requests",
        "300",
        *tiers,
        "--num-gpu-blocks",
        "600",
        "--policy",
        "ema-head",
        "--policy-param",
        "ema-head.head_granular=true",
        "--policy-param",
        "ema-head.tolerate_loss=0.001",
        "--out",
        str(out),
    ]
    subprocess.run(args, check=True, capture_output=True, text=True)
    table = pq.read_table(out / "requests.parquet")
    lossy = table.column("lossy_hits").to_numpy()
    lost = table.column("attention_mass_lost").to_numpy()
    assert lossy.sum() > 0 and (lost[lossy > 0] > 0).all() and (lost[lossy == 0] == 0).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lossy_hits_per_request"] > 0 and summary["attention_mass_lost_per_request"] > 0
    if "dram" in tiers[1]:
        assert table.column("dram_tokens").to_numpy().sum() > 0

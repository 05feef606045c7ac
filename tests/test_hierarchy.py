"""The memory hierarchy below HBM: conservation, capacity, placement, load-or-recompute,
prefetching, per-tier policies, cost, and determinism."""

from __future__ import annotations

import dataclasses
import os

import pytest
from helpers import Req, make_trace, same_table, unless_compiled, without_front_end
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.engine import EngineConfig, simulate
from kvsim.engine import scheduler as scheduler_module
from kvsim.errors import ConfigError, KvsimError
from kvsim.hardware import load_profile
from kvsim.metrics import summarize
from kvsim.models import load_model

MODEL = load_model("llama-3.1-8b")
# without the front end's per-request overhead, which shifts every TTFT alike: the times
# below are the tiers' and the cost model's alone
PROFILE = without_front_end(load_profile("h100-sxm"))
BLOCK_BYTES = 16 * 131_072  # llama-3.1-8b bf16, tp 1


def blocks(n: int) -> str:
    """A per-node capacity that gives a tp=1 replica `n` blocks (the node has 8 GPUs)."""
    return f"{n * BLOCK_BYTES * 8}B"


def run(reqs, profile=PROFILE, **engine):
    result = simulate(make_trace(reqs), MODEL, profile, EngineConfig(**engine))
    return result, result.requests.to_pydict()


def churn(n_prompts: int, rounds: int, tokens: int = 320, gap_s: float = 2.0) -> list[Req]:
    """`n_prompts` distinct prompts asked `rounds` times over: reuse at a long distance."""
    return [
        Req([(p + 1, tokens)], 4, arrival_s=gap_s * (r * n_prompts + p))
        for r in range(rounds)
        for p in range(n_prompts)
    ]


def test_evicted_blocks_come_back_from_dram():
    reqs = churn(3, 2, tokens=4000)  # long prompts: prefill is compute-bound, loading pays
    config = dict(num_gpu_blocks=300, tier_capacity=f"dram={blocks(2000)}")
    _, hbm_only = run(reqs, tiers="hbm", **config)
    _, with_dram = run(reqs, tiers="hbm,dram", **config)
    second = slice(3, 6)
    assert sum(hbm_only["cached_tokens"][second]) == 0  # HBM alone forgot them
    # all but the last block or so: computing a few tokens in a weight-bound pass is free
    assert all(240 * 16 <= t <= 249 * 16 for t in with_dram["dram_tokens"][second])
    assert all(w > 0 for w in with_dram["load_wait_s"][second])
    assert all(
        a < b for a, b in zip(with_dram["ttft_s"][second], hbm_only["ttft_s"][second], strict=True)
    )


def test_load_chosen_only_when_faster_than_recompute():
    slow = dataclasses.replace(
        PROFILE,
        tiers=tuple(
            dataclasses.replace(t, latency_s=5.0) if t.name == "dram" else t for t in PROFILE.tiers
        ),
    )
    _, rows = run(churn(6, 2), profile=slow, num_gpu_blocks=40, tiers="hbm,dram")
    assert sum(rows["dram_tokens"]) == 0  # 5 s to reach DRAM: recomputing is always faster
    assert sum(rows["load_wait_s"]) == 0


def test_a_chosen_load_is_never_slower_than_recomputing():
    reqs = churn(8, 3, tokens=2000, gap_s=5.0)  # one at a time: no link is shared
    _, rows = run(
        reqs,
        num_gpu_blocks=200,
        tiers="hbm,dram,nvme",
        tier_capacity=f"dram={blocks(150)},nvme={blocks(2000)}",
    )
    from kvsim.costmodel import make_cost_model

    prefill = make_cost_model(MODEL, PROFILE).prefill_time_s
    loaded = 0
    for i, wait in enumerate(rows["load_wait_s"]):
        n = (rows["dram_tokens"][i] + rows["nvme_tokens"][i]) // 16
        if not n:
            continue
        loaded += 1
        start = rows["cached_tokens"][i]
        done = start + 16 * n
        total = rows["input_tokens"][i]
        with_load = wait + prefill(total - done, done, 8192)
        assert with_load <= prefill(total - start, start, 8192)
        assert rows["ttft_s"][i] == pytest.approx(with_load, rel=1e-9)
    assert loaded > 0


def test_turning_a_tier_off_never_increases_hits():
    reqs = churn(10, 3, tokens=500)
    ratios = []
    for tiers in ("hbm", "hbm,dram", "hbm,dram,nvme"):
        result, _ = run(
            reqs,
            num_gpu_blocks=60,
            tiers=tiers,
            tier_capacity=f"dram={blocks(120)},nvme={blocks(5000)}",
        )
        ratios.append(summarize(result)["prefix_hit_ratio"])
    assert ratios[0] <= ratios[1] <= ratios[2]
    assert ratios[2] > ratios[0]


def test_prefetch_brings_the_next_turn_back_during_think_time():
    session = [
        Req([(1, 640)], 20, session_id=1, turn=0, output_hash=11),
        Req([(1, 640), (11, 20), (2, 30)], 5, session_id=1, turn=1, think_time_s=30.0),
    ]
    noise = [Req([(100 + i, 640)], 2, arrival_s=5.0 + i) for i in range(4)]  # flush HBM
    config = dict(num_gpu_blocks=50, tiers="hbm,dram", tier_capacity=f"dram={blocks(400)}")
    result, on = run(session + noise, prefetch=True, **config)
    _, off = run(session + noise, prefetch=False, **config)
    turn = on["request_id"].index(1)
    assert off["dram_tokens"][turn] > 0 and off["load_wait_s"][turn] > 0
    # prefetched into HBM before it arrived: no load on its critical path
    assert on["dram_tokens"][turn] == 0 and on["load_wait_s"][turn] == 0
    assert on["cached_tokens"][turn] > off["cached_tokens"][turn]
    assert on["ttft_s"][turn] < off["ttft_s"][turn]
    assert result.prefetched_blocks > 0


def test_per_tier_policies_and_bad_names():
    reqs = churn(6, 2)
    result, _ = run(
        reqs,
        num_gpu_blocks=40,
        tiers="hbm,dram",
        policy="hbm=lru,dram=fifo",
        tier_capacity=f"dram={blocks(60)}",
    )
    assert result.tiers["dram"]["capacity_blocks"] == 60
    with pytest.raises(KvsimError, match="unknown tier 'ssd'"):
        run(reqs, tiers="hbm,ssd")
    with pytest.raises(KvsimError, match="unknown policy"):
        run(reqs, policy="hbm=lru,dram=nope", tiers="hbm,dram")
    with pytest.raises(ConfigError, match="inclusive"):
        run(reqs, write_policy="write-through", hierarchy="exclusive")


def test_cost_is_gpu_plus_tier_share_over_simulated_time():
    result, _ = run(churn(4, 2), num_gpu_blocks=40, tiers="hbm,dram")
    summary = summarize(result)
    dram = PROFILE.tier("dram")
    hourly = PROFILE.gpu_usd_per_hour + dram.capacity_bytes / 8 / 1e9 * dram.usd_per_gb_hour
    assert summary["cost_usd"] == pytest.approx(hourly * summary["simulated_s"] / 3600)
    tokens = summary["input_tokens"] + summary["output_tokens"]
    assert summary["cost_per_million_tokens_usd"] == pytest.approx(
        summary["cost_usd"] / tokens * 1e6
    )


def test_same_seed_same_results_with_tiers():
    reqs = churn(8, 3, tokens=700)
    config = dict(
        num_gpu_blocks=80,
        tiers="all",
        tier_capacity=f"dram={blocks(60)},cxl={blocks(60)},nvme={blocks(200)}",
    )
    a, _ = run(reqs, **config)
    b, _ = run(reqs, **config)
    assert same_table(a.requests, b.requests) and same_table(a.timeline, b.timeline)


@st.composite
def tiered_workloads(draw):
    n = draw(st.integers(2, 30))
    reqs = [
        Req(
            [(draw(st.integers(1, 5)), draw(st.integers(16, 600)))],
            draw(st.integers(1, 60)),
            arrival_s=draw(st.floats(0, 20)),
        )
        for _ in range(n)
    ]
    mode = draw(
        st.sampled_from(["write-back/inclusive", "write-back/exclusive", "write-through/inclusive"])
    )
    write, hierarchy = mode.split("/")
    engine = dict(
        num_gpu_blocks=draw(st.integers(45, 200)),
        tiers=draw(st.sampled_from(["hbm,dram", "hbm,dram,nvme", "all"])),
        tier_capacity=",".join(
            f"{t}={blocks(draw(st.integers(1, 80)))}"
            for t in ("dram", "cxl", "nvme", "rdma", "pfs")
        ),
        write_policy=write,
        hierarchy=hierarchy,
        admission=draw(st.sampled_from(["all", "second-chance", "dram=all,nvme=second-chance"])),
        policy=draw(st.sampled_from(["lru", "hbm=lru,dram=fifo,nvme=arc", "s3fifo"])),
    )
    return reqs, engine


@unless_compiled("kvsim.engine.scheduler")
@settings(
    max_examples=int(os.environ.get("KVSIM_EXAMPLES", 40)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(tiered_workloads())
def test_hierarchy_invariants(case):
    reqs, engine = case
    complete = scheduler_module.Scheduler._complete

    def checked(self, decoders, batch):
        complete(self, decoders, batch)
        hierarchy = self.kv.hierarchy
        if hierarchy is None:
            return
        hierarchy.check()  # capacity, conservation of blocks (and so of bytes), placement
        if not hierarchy.inclusive:
            resident_below = {k for k, t in hierarchy.where.items() if t >= 0}
            in_flight = {k for t in hierarchy.tiers for k in t.pinned}
            assert not (set(self.kv.pool.refs) & resident_below) - in_flight

    scheduler_module.Scheduler._complete = checked
    try:
        result, rows = run(reqs, **engine)
    finally:
        scheduler_module.Scheduler._complete = complete
    assert all(s == "completed" for s in rows["status"])
    for name, tier in result.tiers.items():
        assert tier["resident_blocks"] <= tier["capacity_blocks"], name
        link = result.links[name]
        # bytes conservation on the link: every byte written or read was counted once
        assert link["bytes_written"] >= tier["bytes_written"] - 1


def test_rope_reuse_takes_a_document_at_a_new_position():
    doc = (777, 1600)
    first = Req([(1, 200), doc, (2, 50)], 4, arrival_s=0.0, kinds=["system", "document", "user"])
    # the same document after a different system prompt: no shared prefix, same content
    second = Req([(3, 328), doc, (4, 50)], 4, arrival_s=5.0, kinds=["system", "document", "user"])
    _, off = run([first, second], tiers="hbm")
    _, on = run([first, second], tiers="hbm", rope_reuse=True)
    assert off["cached_tokens"][1] == 0 and off["rope_reused_tokens"][1] == 0
    assert on["rope_reused_tokens"][1] == 1600 - 1600 % 16 - 16  # the doc's blocks inside it
    assert on["rope_reused_tokens"][0] == 0
    assert on["ttft_s"][1] < off["ttft_s"][1]

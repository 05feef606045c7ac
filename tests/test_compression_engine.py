"""KV compression in the engine (issue 14): pages, prefix reuse, compaction, cost, auto, InfiniGen.

Figures are hand-computed for llama-3.1-8b (32 layers, 8 KV heads of 128 dims, bf16): an
uncompressed token is 32 x 8 x (128 + 128) x 2 = 131,072 bytes, a 16-token page 2,097,152.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import simpy
from helpers import Req, make_trace, unless_compiled

from kvsim.capacity import profile_capacity_report
from kvsim.compression import bytes_per_kept_token, compressed_kv_bytes, parse_compression
from kvsim.costmodel import make_cost_model
from kvsim.engine.compress import EngineCompression, page_bytes
from kvsim.engine.config import EngineConfig
from kvsim.engine.pricing import CompressedPricer
from kvsim.engine.resolve import resolve_engine
from kvsim.engine.simulation import simulate
from kvsim.errors import ConfigError
from kvsim.hardware import load_profile
from kvsim.kvcache.link import Link
from kvsim.kvcache.manager import KVCacheManager
from kvsim.models import kv_bytes_per_block, load_model
from kvsim.run import RunConfig, run, write_outputs

MODEL = load_model("llama-3.1-8b")
PROFILE = load_profile("h100-sxm")
TOKEN = 131_072
PAGE = 16 * TOKEN


def sim(reqs, **engine):
    result = simulate(make_trace(reqs), MODEL, PROFILE, EngineConfig(**engine))
    return result, result.requests.to_pydict()


# -- none is today's engine ---------------------------------------------------------------------
def test_none_reproduces_a_run_without_the_option():
    base = RunConfig(trace="sharegpt", max_requests=150)
    plain = run(base)
    none = run(dataclasses.replace(base, engine=EngineConfig(compression="none")))
    assert plain.result.requests.equals(none.result.requests)
    a = {k: v for k, v in plain.summary.items() if k != "wall_s"}
    b = {k: v for k, v in none.summary.items() if k != "wall_s"}
    assert a == b
    assert "compression" not in plain.result.requests.column_names  # digests stay as they were


@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-v3", "gemma-2-27b", "jamba-v0.1"])
def test_none_pages_are_todays_blocks(name):
    model = load_model(name)
    none = parse_compression("none")
    for bs in (1, 16, 32):
        assert page_bytes(model, none, bs, "bf16", 1) == kv_bytes_per_block(model, bs, "bf16", 1)
        assert math.ceil(bs * bytes_per_kept_token(model, none)) == kv_bytes_per_block(model, bs)


# -- pages --------------------------------------------------------------------------------------
def test_quant_page_bytes_and_pool_growth_by_hand():
    quant = parse_compression("quant:k=4,v=4")
    # per head and token: 128 x 4 / 8 = 64 bytes + ceil(128 / 32) groups x 4 bytes of scale and
    # zero-point = 80 for K, 80 for V; x 8 heads x 32 layers = 40,960 bytes; x 16 tokens
    assert page_bytes(MODEL, quant, 16, "bf16", 1) == 16 * 40_960 == 655_360
    config = EngineConfig(compression="quant:k=4,v=4")
    none = resolve_engine(EngineConfig(), MODEL, PROFILE)
    none_blocks, none_bytes = none.num_blocks, none.block_bytes
    quant = resolve_engine(config, MODEL, PROFILE)
    blocks, nbytes = quant.num_blocks, quant.block_bytes
    cap = profile_capacity_report(MODEL, PROFILE)["kv_capacity_bytes_per_rank"]
    assert (none_bytes, nbytes) == (PAGE, 655_360)
    assert blocks == int(cap // 655_360) and none_blocks == int(cap // PAGE)
    assert blocks / none_blocks == pytest.approx(PAGE / 655_360, rel=1e-3)  # 3.2x the pages
    result, _ = sim([Req([(1, 100)], 2)], compression="quant:k=4,v=4")
    assert (result.num_gpu_blocks, result.block_bytes) == (blocks, 655_360)


def test_quant_residual_pages_are_held_beside_the_tokens():
    comp = EngineCompression(parse_compression("quant:k=4,v=4"), 0, MODEL, "bf16", 1, 16, 655_360)
    # 128 residual tokens x (4,096 - 1,280) bytes x 32 layers = 11,534,336 bytes = 17.6 pages
    assert comp.reserved_blocks(5000) == 18
    # a 16-token request: at most what its one uncompressed page holds (3 quant pages)
    assert comp.reserved_blocks(16) == 2
    result, _ = sim([Req([(1, 1000)], 10)], compression="quant:k=4,v=4")
    # 1,009 tokens in KV at the end: 64 token pages + 18 residual pages
    assert result.kv_peak_bytes[0] == (64 + 18) * 655_360
    assert result.kv_peak_bytes[0] == pytest.approx(
        compressed_kv_bytes(MODEL, parse_compression("quant:k=4,v=4"), 1009), rel=0.02
    )


@pytest.mark.parametrize(
    "text", ["quant:k=4,v=4", "quant:k=16,v=8", "quant:k=8,v=16,residual=1000"]
)
def test_residual_pages_for_long_requests_equal_the_formula(text):
    comp = parse_compression(text)
    e = EngineCompression(comp, 0, MODEL, "bf16", 1, 16, page_bytes(MODEL, comp, 16, "bf16", 1))
    for n in range(1, 3000):
        pages = -(-math.ceil(min(n, e.residual) * e._residual_gap) // e.block_bytes)
        blocks = -(-n // 16)
        assert e.reserved_blocks(n) == min(pages, blocks * PAGE // e.block_bytes - blocks), n


@pytest.mark.parametrize(
    "text",
    ["h2o:budget=0.2", "streaming:sinks=4,window=300", "snapkv:capacity=256", "lkv", "kvp",
     "moe-nd:budget=0.3", "quant:k=2,v=2"],
)  # fmt: skip
def test_engine_bytes_equal_the_sizing_module(text):
    comp = parse_compression(text)
    e = EngineCompression(comp, 0, MODEL, "bf16", 1, 16, page_bytes(MODEL, comp, 16, "bf16", 1))
    for n, g in [(1, 0), (17, 0), (500, 0), (1000, 0), (4097, 0), (1300, 300), (9000, 7)]:
        want = compressed_kv_bytes(MODEL, comp, n, generated_tokens=g if comp.prompt_only else 0)
        if comp.name == "quant":
            assert e.full_bytes(n) == want
        else:
            assert e.kv_bytes(n, g) == want, (n, g)


@pytest.mark.parametrize("text", ["quant:k=4,v=4", "quant:k=2,v=4,residual=0", "quant:k=8,v=8"])
def test_equivalent_sum_is_the_sum_of_each_sequences_equivalent_tokens(text):
    """quant's batches are priced from `equivalent_sum`: the same as adding each sequence's
    `equivalent_tokens`, short contexts (a residual not yet full) and runs `ahead` included."""
    parsed = parse_compression(text)
    comp = EngineCompression(
        parsed, 0, MODEL, "bf16", 1, 16, page_bytes(MODEL, parsed, 16, "bf16", 1)
    )
    assert comp.linear_reads and (comp.residual > 0) == ("residual=0" not in text)
    for contexts in ([5, 40, 127, 128, 129], [3000, 9000], [1], []):
        for ahead in (0, 1, 57):
            each = sum(comp.equivalent_tokens(c + ahead) for c in contexts)
            assert comp.equivalent_sum(contexts, ahead) == pytest.approx(each, rel=1e-12)


# -- prefix reuse -------------------------------------------------------------------------------
def test_a_request_whose_compression_differs_never_hits_anothers_blocks():
    prompt = [(7, 2000)]
    # auto picks none while a request fits the memory budget, else the fewest bytes (quant);
    # the budget sits between a 2,010-token and a 6,000-token request's uncompressed KV
    memory = 4000 * TOKEN
    cfg = dict(compression="auto:none|quant:k=4,v=4", num_gpu_blocks=20_000)
    blocks = 20_000 * PAGE
    reqs = [
        Req(prompt, 10, arrival_s=0.0),  # none
        Req(prompt, 4000, arrival_s=100.0),  # quant: never hits the none blocks
        Req(prompt, 10, arrival_s=400.0),  # none again: hits the first request's blocks
        Req(prompt, 4000, arrival_s=500.0),  # quant again: hits the second's
    ]
    result, rows = sim(reqs, auto_memory_fraction=memory / blocks, **cfg)
    labels = result.request_compression.to_pylist()
    assert labels == ["none", *(["quant:group=32,k=4,residual=128,v=4", "none"] * 1),
                      "quant:group=32,k=4,residual=128,v=4"]  # fmt: skip
    assert rows["cached_tokens"] == [0, 0, 1984, 1984]


def test_token_dropping_blocks_are_not_reused_but_same_profile_short_prompts_are():
    prompt = [(7, 2000)]
    _, rows = sim([Req(prompt, 5), Req(prompt, 5, arrival_s=50.0)], compression="h2o")
    assert rows["cached_tokens"] == [0, 0]  # compacted pages sit at no prefix position
    short = [(9, 200)]  # within streaming's 1,024-token cache: nothing dropped, all reusable
    _, rows = sim([Req(short, 5), Req(short, 5, arrival_s=50.0)], compression="streaming")
    assert rows["cached_tokens"] == [0, 192]


# -- compaction ---------------------------------------------------------------------------------
@unless_compiled("kvsim.kvcache.manager")
def test_token_dropping_holds_its_kept_blocks_after_prefill(monkeypatch):
    seen = {}
    compact, free = KVCacheManager.compact, KVCacheManager.free

    def spy_compact(self, req, now_s):
        compact(self, req, now_s)
        seen["after_prefill"] = (req.table.held_blocks, self.pool.free_uncached)

    def spy_free(self, req, now_s, table=None):
        seen["at_finish"] = req.table.held_blocks
        free(self, req, now_s, table)

    monkeypatch.setattr(KVCacheManager, "compact", spy_compact)
    monkeypatch.setattr(KVCacheManager, "free", spy_free)
    result, _ = sim([Req([(1, 1000)], 300)], compression="h2o:budget=0.2", num_gpu_blocks=500)
    # prefill holds ceil(1000 / 16) = 63 pages; H2O keeps ceil(0.2 x 1000) = 200 tokens =
    # 200 x 131,072 / 2,097,152 = 12.5 -> 13 pages, and frees the other 50
    assert seen["after_prefill"] == (13, 500 - 13)
    assert result.kv_peak_bytes[0] == 63 * PAGE
    # at the end 1,299 tokens are in KV: ceil(0.2 x 1,299) = 260 kept -> 16.25 -> 17 pages
    assert seen["at_finish"] == 17


@pytest.mark.parametrize(
    "text",
    ["quant:k=4,v=4", "quant:k=2,v=2", "h2o", "streaming", "snapkv", "lkv", "kvp",
     "moe-nd:budget=0.3", "infinigen", "auto"],
)  # fmt: skip
def test_compression_never_raises_memory(text):
    base = RunConfig(trace="sharegpt", max_requests=120)
    none = run(base).result
    other = run(dataclasses.replace(base, engine=EngineConfig(compression=text))).result
    assert np.all(other.kv_peak_bytes <= none.kv_peak_bytes)
    assert other.peak_hbm_kv_bytes <= none.peak_hbm_kv_bytes


# -- auto ---------------------------------------------------------------------------------------
def test_auto_logs_one_label_per_request(tmp_path):
    # a tight budget: the step of a light batch (four sequences of 1,000 tokens), which a
    # request arriving beside a busier batch or with a long reply would exceed uncompressed
    cost = make_cost_model(load_model("llama-3.1-8b"), load_profile("h100-sxm"))
    budget = cost.iteration_time_s([], [1000] * 4)
    config = RunConfig(
        trace="sharegpt",
        max_requests=100,
        engine=EngineConfig(compression="auto", auto_latency_budget_s=budget),
    )
    outcome = run(config)
    out = write_outputs(outcome, tmp_path / "auto")
    table = pq.read_table(out / "requests.parquet")
    labels = table.column("compression").to_pylist()
    allowed = {c.label for c in parse_compression("auto").candidates}
    assert len(labels) == table.num_rows == 100 and set(labels) <= allowed
    assert len(set(labels)) > 1  # a tight latency budget moves some requests off none
    chosen = outcome.summary["compression_chosen"]
    assert sum(chosen.values()) == 100
    assert outcome.config.engine.compression == parse_compression("auto").label


def test_every_requests_parquet_has_the_compression_column(tmp_path):
    outcome = run(RunConfig(trace="sharegpt", max_requests=20))
    table = pq.read_table(write_outputs(outcome, tmp_path / "r") / "requests.parquet")
    assert set(table.column("compression").to_pylist()) == {"none"}
    assert outcome.summary["quality"]["retained"] == 1.0


def test_compression_with_pd_is_refused():
    with pytest.raises(ConfigError, match="compression with --pd"):
        sim([Req([(1, 100)], 2)], compression="h2o", pd="1:1")


# -- cost ---------------------------------------------------------------------------------------
def test_decode_reads_only_the_kept_tokens():
    long = [Req([(1, 8000)], 200)]
    _, rows_none = sim(long)
    _, rows_h2o = sim(long, compression="h2o:budget=0.1")
    assert rows_h2o["tpot_s"][0] < rows_none["tpot_s"][0]
    assert rows_h2o["ttft_s"][0] >= rows_none["ttft_s"][0]  # prefill is over the whole prompt


# -- InfiniGen ----------------------------------------------------------------------------------
def _step_s(fetch: float, compute_s: float, traffic: float = 0.0) -> float:
    env = simpy.Environment()
    link = Link(env, "dram", 50e9, 50e9, 2e-6)
    pricer = CompressedPricer(env, None, host_link=link)  # type: ignore[arg-type]
    took = {}

    def step():
        if traffic:
            link.transfer(int(traffic))  # a tier load towards HBM on the same link
        start = env.now
        yield from pricer.fetching(compute_s, fetch)
        took["s"] = env.now - start

    env.process(step())
    env.run()
    return took["s"]


def test_infinigen_step_is_max_of_compute_and_fetch_and_shares_the_host_link():
    e = EngineCompression(parse_compression("infinigen:budget=0.2"), 0, MODEL, "bf16", 1, 16, 1)
    # one sequence at 10,000 tokens fetches ceil(0.2 x 10,000) = 2,000 tokens x 131,072 bytes
    fetch = e.fetch_bytes(10_000)
    assert fetch == 2000 * TOKEN == 262_144_000
    alone = _step_s(fetch, compute_s=0.001)
    assert alone >= 2e-6 + fetch / 50e9 == pytest.approx(0.00524488)  # transfer-bound
    assert _step_s(fetch, compute_s=0.01) == pytest.approx(0.01)  # compute hides the fetch
    # a 50 % budget fetches 2.5x the bytes
    more = EngineCompression(parse_compression("infinigen:budget=0.5"), 0, MODEL, "bf16", 1, 16, 1)
    assert _step_s(more.fetch_bytes(10_000), 0.001) > 2.4 * alone
    # a concurrent tier load of the same size on the host link halves the fetch's share
    shared = _step_s(fetch, compute_s=0.001, traffic=fetch)
    assert shared >= 2 * fetch / 50e9


def test_infinigen_decode_grows_with_its_budget():
    reqs = [Req([(i, 4000)], 100, arrival_s=0.01 * i) for i in range(8)]
    _, low = sim(reqs, compression="infinigen:budget=0.1")
    _, high = sim(reqs, compression="infinigen:budget=0.6")
    assert np.nanmean(high["tpot_s"]) > np.nanmean(low["tpot_s"])


# -- command line ---------------------------------------------------------------------------------
def test_compare_takes_compression_labels_between_semicolons():
    from kvsim.cli import _settings

    got = _settings(("compression=none;quant:k=4,v=4;h2o",), "vary", lists=True)
    assert got == {"compression": ["none", "quant:k=4,v=4", "h2o"]}
    assert _settings(("compression=quant:k=4,v=4",), "vary", lists=True) == {
        "compression": ["quant:k=4,v=4"]
    }


def test_run_refuses_an_unknown_profile_in_one_line(tmp_path, capsys):
    from kvsim.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--max-requests", "5", "--compression", "zip", "--out", str(tmp_path / "r")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "unknown compression profile 'zip'" in err and "\n" not in err

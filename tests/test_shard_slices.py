"""Windows that read a trace file in slices (kvsim.shard.source): the same bits as windows cut
from the loaded trace, only the row groups a window needs, and one-line errors that name the
file's own row."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import same_table

from kvsim.engine import EngineConfig
from kvsim.engine.window import Window
from kvsim.errors import TraceError
from kvsim.resolve import resolve
from kvsim.run import RunConfig
from kvsim.shard import Sharding, run_split
from kvsim.shard import source as slices
from kvsim.shard.run import ShardedRun, retimed_trace, run_cost_model
from kvsim.traces import load_trace
from kvsim.traces.schema import write_trace

MACHINE = {"wall_s", "shard_wall_s", "shard_cpu_s", "shard_peak_rss_bytes"}


@pytest.fixture(scope="module")
def lmsys_file(tmp_path_factory) -> str:
    """1,200 lmsys requests (closed-loop turns) as a canonical Parquet file."""
    path = tmp_path_factory.mktemp("slices") / "lmsys.parquet"
    write_trace(load_trace("lmsys", max_requests=1200, rate=8.0), path)
    return str(path)


@pytest.fixture(autouse=True)
def small_row_groups(monkeypatch) -> None:
    monkeypatch.setattr(slices, "BATCH_ROWS", 100)  # many row groups: slices read a few
    monkeypatch.setattr(slices, "FIRST_LOOK_BACK_S", 5.0)  # and read back more than once


def _config(path: str, **run) -> RunConfig:
    # DRAM of 1,000 blocks a replica (llama-3.1-8b: 128 KiB a token, 16 a block): the caches
    # hold a few hundred requests, so a late window's warm-up replays only the latest ones
    engine = EngineConfig(
        replicas=3,
        tiers="hbm,dram",
        num_gpu_blocks=400,
        router="session",
        tier_capacity=f"dram={1000 * 16 * 131072}B",
    )
    return RunConfig(trace=path, engine=engine, **run)


def _same(a, b) -> None:
    assert same_table(a.result.requests, b.result.requests)
    assert same_table(a.result.timeline, b.result.timeline)
    drop = lambda s: {k: v for k, v in s.items() if k not in MACHINE}  # noqa: E731
    assert drop(a.summary) == drop(b.summary)


@pytest.mark.parametrize("run", [{}, {"max_requests": 700}])
def test_slices_of_the_file_give_the_bits_of_the_loaded_trace(lmsys_file, run) -> None:
    config = _config(lmsys_file, **run)
    loaded = load_trace(lmsys_file, max_requests=run.get("max_requests"))
    sharding = Sharding(4, warmup_s=10, jobs=1)
    read = ShardedRun.cut_file(resolve(config), sharding)
    assert read is not None and isinstance(read.trace, slices.Retimed)  # read in slices
    read.close()
    _same(run_split(config, sharding), run_split(config, sharding, trace=loaded))


def test_a_late_window_reads_only_its_horizon(lmsys_file) -> None:
    resolved = resolve(_config(lmsys_file))
    copy = slices.stream_retimed(lmsys_file, *run_cost_model(resolved))
    assert copy is not None
    try:
        start = float(np.quantile(copy.arrival_s, 0.9))
        window = Window(start, math.inf, 5.0)
        trace, where = slices.window_trace(copy.file, window, resolved.engine)
        loaded = slices.InMemory(retimed_trace(resolved, load_trace(lmsys_file)))
        whole, rows = slices.window_trace(loaded, window, resolved.engine)
        assert same_table(trace.table, whole.table) and np.array_equal(where, rows)
        before = int((copy.arrival_s < start - 5.0).sum())
        kept = int((trace.table.column("arrival_s").to_numpy() < start - 5.0).sum())
        assert 0 < kept < before  # the caches hold less than the trace before the window
        assert pq.ParquetFile(copy.file.path).metadata.num_row_groups == 12
    finally:
        copy.close()


def test_a_file_whose_ids_do_not_number_its_rows_is_loaded_whole(lmsys_file, tmp_path) -> None:
    table = pq.read_table(lmsys_file)
    shifted = [
        pa.compute.add(table.column(c), 5000) if c in ("request_id",) else table.column(c)
        for c in table.column_names
    ]
    parent = table.column("parent_id").to_numpy()
    shifted[table.column_names.index("parent_id")] = pa.array(
        np.where(parent >= 0, parent + 5000, -1)
    )
    path = tmp_path / "shifted.parquet"
    pq.write_table(pa.Table.from_arrays(shifted, schema=table.schema), path)
    config = _config(str(path))
    sharding = Sharding(3, warmup_s=10, jobs=1)
    assert ShardedRun.cut_file(resolve(config), sharding) is None
    _same(run_split(config, sharding), run_split(config, sharding, trace=load_trace(str(path))))


def test_a_bad_row_is_named_by_its_place_in_the_file(lmsys_file, tmp_path) -> None:
    table = pq.read_table(lmsys_file)
    out = table.column("output_tokens").to_numpy().copy()
    out[437] = 0
    i = table.column_names.index("output_tokens")
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(i, table.schema.field(i), pa.array(out)), bad)
    with pytest.raises(TraceError) as whole:
        load_trace(str(bad))
    with pytest.raises(TraceError) as sliced:
        run_split(_config(str(bad)), Sharding(3, jobs=1))
    assert "row 437" in str(sliced.value) and str(sliced.value) == str(whole.value)


def test_a_plan_re_times_the_file_once_and_its_runs_are_the_sharded_runs(lmsys_file) -> None:
    from kvsim.plan.runner import ShardedRunner

    sharding = Sharding(3, warmup_s=10, jobs=1)
    configs = [_config(lmsys_file), dataclasses.replace(_config(lmsys_file), max_requests=900)]
    configs.append(
        dataclasses.replace(configs[0], engine=dataclasses.replace(configs[0].engine, replicas=2))
    )
    with ShardedRunner(sharding, "local", jobs=1) as runner:
        summaries = runner(configs)
        copies = [c for c in runner._copies.values() if c is not None]
        assert len(copies) == 2  # one per request count; the replica count shares it
        folders = [Path(c.file.path).parent for c in copies]
    assert not any(f.exists() for f in folders)  # removed with the runner
    drop = lambda s: {k: v for k, v in s.items() if k not in MACHINE}  # noqa: E731
    for config, summary in zip(configs, summaries, strict=True):
        assert drop(summary) == drop(run_split(config, sharding).summary)


@pytest.mark.parametrize("dram_blocks", [300, 1000, 4000])
def test_the_horizon_found_stepping_back_is_the_engines(lmsys_file, dram_blocks) -> None:
    from kvsim.engine.trace_view import TraceRequests
    from kvsim.engine.warmup import replay_horizon

    config = dataclasses.replace(
        _config(lmsys_file),
        engine=dataclasses.replace(
            _config(lmsys_file).engine, tier_capacity=f"dram={dram_blocks * 16 * 131072}B"
        ),
    )
    resolved = resolve(config)
    trace = load_trace(lmsys_file)
    source = TraceRequests(trace, resolved.engine.config.block_size)
    blocks = slices.fleet_horizon_blocks(resolved.engine, trace)
    arrival = source.arrival_s
    found = 0
    for start in np.quantile(arrival, [0.2, 0.5, 0.8, 0.99]):
        warm = replay_horizon(source, np.flatnonzero(arrival < start), blocks)
        reached = warm.size < int((arrival < start).sum())
        expected = float(arrival[warm].min()) if reached else -math.inf
        for rows in (slices.InMemory(trace), _file_rows(lmsys_file)):
            assert slices.horizon_start(rows, float(start), resolved.engine) == expected
        found += reached
    assert found  # some horizons fall inside the trace


def _file_rows(path: str) -> slices.TraceFile:
    """The file itself, read in slices (its times are not re-timed: the horizon reads any)."""
    first = float(pq.read_table(path, columns=["arrival_s"]).column(0).to_numpy().min())
    return slices.TraceFile(path, first)

"""`kvsim trace synth lmsys` streams: the file is the in-memory table, written in row groups."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kvsim.errors import KvsimError
from kvsim.traces import load_trace
from kvsim.traces.arrivals import GammaProcess, PoissonProcess
from kvsim.traces.chat import read_lmsys
from kvsim.traces.cli import trace as trace_cli
from kvsim.traces.convert import convert_to_parquet
from kvsim.traces.lmsys import (
    LmsysParams,
    generate_lmsys,
    lmsys_sessions,
    stream_lmsys,
    write_lmsys_parquet,
)
from kvsim.traces.registry import stream_lmsys_trace


def assert_same_trace(path, expected):
    back = load_trace(path)
    assert back.table.equals(expected.table)
    assert (back.name, back.description) == (expected.name, expected.description)
    assert back.table.schema.metadata == expected.table.schema.metadata


@pytest.mark.parametrize(
    "n,seed,rate,chunk",
    [(50, 0, None, 100), (1000, 3, 2.5, 100), (7777, 1, None, 50_000), (7777, 1, None, 37),
     (20_000, 5, 11.46, 1_000)],
)  # fmt: skip
def test_streamed_file_is_the_in_memory_table(tmp_path, n, seed, rate, chunk):
    out = tmp_path / "t.parquet"
    source = stream_lmsys_trace(n, seed=seed, rate=rate, chunk_sessions=chunk)
    assert convert_to_parquet(source, out, max_requests=n) == (n, 0)
    assert_same_trace(out, load_trace("lmsys", max_requests=n, seed=seed, rate=rate))


def test_row_groups_are_in_arrival_order(tmp_path):
    out = tmp_path / "t.parquet"
    convert_to_parquet(stream_lmsys_trace(5_000, seed=2, chunk_sessions=100), out,
                       max_requests=5_000)  # fmt: skip
    meta = pq.ParquetFile(out).metadata
    assert meta.num_row_groups > 5
    column = meta.schema.to_arrow_schema().get_field_index("arrival_s")
    stats = [meta.row_group(g).column(column).statistics for g in range(meta.num_row_groups)]
    bounds = [(s.min, s.max) for s in stats]
    assert all(lo <= hi for lo, hi in bounds)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(bounds))


def test_cli_synth_lmsys_writes_the_loaded_trace(tmp_path):
    out = tmp_path / "l.parquet"
    res = CliRunner().invoke(
        trace_cli, ["synth", "lmsys", "--requests", "3000", "--seed", "4", "--rate", "9",
                    "-o", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "wrote 3,000 lmsys requests (seed 4)" in res.output
    assert_same_trace(out, load_trace("lmsys", max_requests=3000, seed=4, rate=9.0))


def test_sessions_double_until_they_hold_the_requests(tmp_path):
    params = LmsysParams(sessions=20)
    sessions = lmsys_sessions(params, 6, 500)
    held = len(generate_lmsys(replace(params, sessions=sessions), seed=6))
    assert sessions > 20 and held >= 500
    assert len(generate_lmsys(replace(params, sessions=sessions // 2), seed=6)) < 500
    params = replace(params, sessions=sessions)
    out = tmp_path / "t.parquet"
    convert_to_parquet(stream_lmsys(params, seed=6, chunk_sessions=7), out, max_requests=500)
    assert_same_trace(out, generate_lmsys(params, seed=6, max_requests=500))


def test_chunked_renewal_draws_are_one_draw_bit_for_bit():
    for make in (lambda: PoissonProcess(3.0, 7), lambda: GammaProcess(2.0, 2.5, 7)):
        whole, pieces = make(), make()
        parts = [pieces.draw(k) for k in (1, 0, 999, 37, 5_000)]
        assert np.array_equal(np.concatenate(parts), whole.draw(6_037))
    # The first draw is the plain running sum of the gaps, the first gap 0, as before.
    gaps = np.random.default_rng(np.random.SeedSequence([7, 0x617272])).exponential(1 / 3.0, 100)
    gaps[0] = 0.0
    assert np.array_equal(PoissonProcess(3.0, 7).draw(100), np.cumsum(gaps))


def test_max_requests_keeps_the_first_rows_of_any_source(tmp_path):
    src, full, capped = tmp_path / "s.parquet", tmp_path / "f.parquet", tmp_path / "c.parquet"
    write_lmsys_parquet(src, 1_500, seed=2, batch=500)
    convert_to_parquet(read_lmsys(src, batch=300), full)
    assert convert_to_parquet(read_lmsys(src, batch=300), capped, max_requests=777) == (777, 0)
    assert pq.read_table(capped).equals(pq.read_table(full).slice(0, 777))
    trace = load_trace(full)
    assert convert_to_parquet(trace, capped, max_requests=10) == (10, 0)
    assert pq.read_table(capped).equals(trace.table.slice(0, 10))
    with pytest.raises(KvsimError, match="'max_requests' must be >= 1"):
        convert_to_parquet(trace, capped, max_requests=0)


def test_a_conversion_times_its_turns_alike_in_any_batch_size(tmp_path):
    # session starts and closed-loop turns carry their running sums across batches
    src = tmp_path / "s.parquet"
    write_lmsys_parquet(src, 1_200, seed=4, batch=400)
    tables = []
    for batch in (1_200, 250, 77):
        out = tmp_path / f"b{batch}.parquet"
        convert_to_parquet(read_lmsys(src, batch=batch), out)
        tables.append(pq.read_table(out))
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])

"""kvsim report: every figure of a cluster run with all tiers, one figure per varied key of a
sweep, a one-line error naming a missing file (nothing written), and single-file HTML."""

from __future__ import annotations

import base64
import re
import shutil

import numpy as np
import pytest
from matplotlib.figure import Figure

from kvsim.cli import main
from kvsim.engine.config import EngineConfig
from kvsim.report import figures, load_run, write_report
from kvsim.report.run_figures import output_rate
from kvsim.report.style import DPI, SIZE_IN
from kvsim.run import RunConfig, run, write_outputs
from kvsim.sweep import run_sweep
from kvsim.sweep.spec import expand_spec

RUN_FIGURES = [
    "latency_cdf",
    "throughput_queue",
    "tier_occupancy",
    "link_bytes",
    "hit_ratio",
    "cost",
    "per_replica",
]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    """Two replicas, every tier, small lower tiers so blocks move down during the run."""
    engine = EngineConfig(
        replicas=2,
        tiers="all",
        num_gpu_blocks=600,
        router="dynamo-kv",
        tier_capacity="dram=2GiB,cxl=2GiB,nvme=4GiB,rdma=2GiB,pfs=4GiB",
    )
    outcome = run(RunConfig(trace="mooncake-conversation", max_requests=40, engine=engine))
    return write_outputs(outcome, tmp_path_factory.mktemp("runs") / "cluster")


def fresh_copy(run_dir, tmp_path):
    """A copy of the run folder without any report in it."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("report"))
    return copy


def test_report_writes_every_figure_it_lists_for_a_cluster_run_with_all_tiers(
    cluster_run, tmp_path, capsys
):
    run_dir = fresh_copy(cluster_run, tmp_path)
    assert len(load_run(run_dir).summary["tiers"]) == 5  # dram, cxl, nvme, rdma, pfs
    drawn = figures(run_dir)
    assert list(drawn) == RUN_FIGURES
    main(["report", str(run_dir)])
    out = run_dir / "report"
    assert str(out / "report.md") in capsys.readouterr().out
    page = (out / "report.md").read_text()
    for name in RUN_FIGURES:
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(PNG)
        assert f"]({name}.png)" in page
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(f"{n}.png" for n in RUN_FIGURES), "report.md"]
    )
    assert "| TTFT p50 / p90 / p99 |" in page
    assert (run_dir / "config.toml").read_text().strip() in page  # the resolved config


def test_every_figure_says_what_it_shows_with_units_at_a_legible_size(cluster_run):
    for name, fig in figures(cluster_run).items():
        assert isinstance(fig, Figure)
        assert fig._suptitle is not None and fig._suptitle.get_text(), name
        width, height = fig.get_size_inches()
        assert width >= SIZE_IN[0] and height >= SIZE_IN[1] and fig.dpi == DPI, name
        for ax in fig.axes:
            assert ax.get_title() or len(fig.axes) == 1, f"{name}: a panel without a title"
            has_data = ax.lines or ax.patches or ax.collections
            if has_data and ax.get_xlabel() and ax.get_ylabel():
                labels = ax.get_xlabel() + ax.get_ylabel()
                assert re.search(r"\(.+\)|replica|tier|link|component", labels), (name, labels)
            for text in (ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels()):
                assert text.get_fontsize() >= 9, (name, text.get_text())


def test_html_is_one_file_with_the_images_embedded(cluster_run, tmp_path):
    out = tmp_path / "html"
    page = write_report(cluster_run, out, html=True)
    assert [p.name for p in out.iterdir()] == ["report.html"] == [page.name]
    text = page.read_text()
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', text)
    assert len(images) == len(RUN_FIGURES)
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    assert 'src="http' not in text and '.png"' not in text


@pytest.mark.parametrize("missing", ["timeline.parquet", "requests.parquet", "COMPLETE"])
def test_a_missing_file_is_one_line_naming_it_exit_2_nothing_written(
    cluster_run, tmp_path, capsys, missing
):
    run_dir = fresh_copy(cluster_run, tmp_path)
    (run_dir / missing).unlink()
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(SystemExit) as exc:
        main(["report", str(run_dir), "--html"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(run_dir / missing) in err
    assert sorted(p.name for p in run_dir.iterdir()) == before
    out = tmp_path / "elsewhere"
    with pytest.raises(SystemExit):
        main(["report", str(run_dir), "--out", str(out)])
    assert not out.exists()


def test_a_sweep_gets_one_figure_per_varied_key(tmp_path, capsys):
    spec = {
        "base": {"trace": "mooncake-conversation", "max_requests": 20},
        "grid": {"policy": ["lru", "s3fifo"], "replicas": [1, 2]},
    }
    sweep_dir = tmp_path / "sweep"
    run_sweep(expand_spec(spec), sweep_dir, jobs=1, progress=False)
    main(["report", str(sweep_dir)])
    out = sweep_dir / "report"
    assert sorted(p.name for p in out.glob("*.png")) == ["vary_policy.png", "vary_replicas.png"]
    assert (out / "vary_policy.png").read_bytes().startswith(PNG)
    page = (out / "report.md").read_text()
    assert "](vary_policy.png)" in page and "](vary_replicas.png)" in page
    assert page.count("| ok |") == 4
    fig = figures(sweep_dir)["vary_replicas"]
    panels = fig.axes
    assert [ax.get_xlabel() for ax in panels] == ["replicas"] * 3
    assert [len(ax.lines) for ax in panels] == [2, 2, 2]  # one series per policy


def test_output_rate_spreads_each_reply_over_its_decode():
    # one request: first token at 1 s, 10 more tokens evenly until 6 s; bins of 1 s
    edges = np.arange(0.0, 8.0)
    rate = output_rate(np.array([1.0]), np.array([6.0]), np.array([11]), edges)
    assert rate.tolist() == pytest.approx([0, 3, 2, 2, 2, 2, 0])
    assert (rate * np.diff(edges)).sum() == pytest.approx(11)


def test_a_reported_run_can_be_rerun_over_with_overwrite(tmp_path):
    out = tmp_path / "run"
    args = ["run", "--trace", "sharegpt", "--max-requests", "20", "--out", str(out)]
    main(args)
    write_report(out)
    assert (out / "report").is_dir()
    main([*args, "--overwrite"])  # refused before: report/ is not a run file
    assert (out / "COMPLETE").is_file()

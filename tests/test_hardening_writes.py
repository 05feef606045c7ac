"""Issue 25, writing results: every command that writes goes through `kvsim.atomic`.

A read-only folder or a full disk (a file-size limit, RLIMIT_FSIZE, in a subprocess) is one line
naming the path, exit 2, and nothing partial that looks complete; temporaries of killed writers
are cleaned; --overwrite means what it says; a killed report leaves no half-written folder.

Read-only folders: root ignores permission bits, so as root the subprocess gives up
CAP_DAC_OVERRIDE (prctl PR_CAPBSET_DROP before exec) and is then refused like any user.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import in_process

from kvsim.atomic import AtomicFolder, WriteError, remove_stale, write_file
from kvsim.run import RunConfig, is_complete, run, write_outputs
from kvsim.sweep import expand_spec, run_sweep

VIDUR = Path(__file__).resolve().parent / "data" / "vidur"
IMPORT = ["calibrate", "import-vidur", str(VIDUR), "--model", "llama-2-70b", "--tp", "2"]
IMPORT += ["--profile", "a100-80gb"]
PLAN = ["plan", "--trace", "mooncake-conversation", "--max-requests", "40", "--executor"]
PLAN += ["serial", "--rates", "1x", "--slo-ttft-p99", "8", "--slo-tpot-p99", "0.1"]
PLAN += ["--routers", "round-robin", "--max-replicas", "4"]
SPEC = "[base]\ntrace = 'mooncake-conversation'\nmax_requests = 20\n[grid]\npolicy = {}\n"
#: A file-size limit smaller than every output the commands below write.
SMALL_FILES = 2000


# -- helpers ---------------------------------------------------------------------------------------


def one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def temporaries(folder: Path) -> list[str]:
    """Every kvsim temporary anywhere under `folder`."""
    return [
        str(p)
        for p in folder.rglob("*")
        if ".partial-" in p.name or ".old-" in p.name or p.name.startswith(".write-test")
    ]


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (SMALL_FILES, SMALL_FILES))


def _obey_permissions() -> None:
    """Before exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set, so a
    root child obeys permission bits (a no-op for other users, who obey them anyway)."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def kvsim(*args: str, preexec=None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "kvsim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
        env=env,
    )


@pytest.fixture
def read_only(tmp_path):
    """A read-only folder, and a check that a child process really cannot write into it."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    probe = [sys.executable, "-c", f"open({str(folder / 'x')!r}, 'w')"]
    try:
        denied = subprocess.run(probe, preexec_fn=_obey_permissions, capture_output=True)
    except subprocess.SubprocessError:
        folder.chmod(0o755)
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here")
    if denied.returncode == 0:
        folder.chmod(0o755)
        pytest.skip("this process writes into read-only folders")
    yield folder
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- the shared writer -----------------------------------------------------------------------------
def test_write_file_replaces_whole_or_leaves_the_old_file(tmp_path):
    path = tmp_path / "plan.json"
    write_file(path, "old")
    assert path.read_text() == "old"

    def half_then_full(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError, match=r"plan\.json: cannot write the plan: No space left"):
        write_file(path, half_then_full, what="the plan")
    assert path.read_text() == "old"

    def interrupted(tmp: Path) -> None:
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C mid-write: no temporary either
        write_file(path, interrupted)
    assert temporaries(tmp_path) == [] and path.read_text() == "old"
    with pytest.raises(WriteError, match="already exists; pass --overwrite"):
        write_file(path, "new", overwrite=False)
    with pytest.raises(WriteError, match="is a folder"):
        write_file(tmp_path, "new")
    with pytest.raises(WriteError, match="does not exist"):
        write_file(tmp_path / "missing" / "x.json", "new")
    # a checker reads the temporary, with the target's suffix, before it replaces anything
    seen = []
    write_file(path, "new", check=lambda tmp: seen.append(tmp.suffix))
    assert seen == [".json"] and path.read_text() == "new"


def test_pyarrow_reasons_are_the_systems_words(tmp_path):
    def like_pyarrow(tmp: Path) -> None:
        raise OSError("Error writing bytes to file. Detail: [errno 27] File too large")

    with pytest.raises(WriteError) as exc:
        write_file(tmp_path / "t.parquet", like_pyarrow)
    assert str(exc.value) == f"{tmp_path / 't.parquet'}: cannot write: File too large"


def test_stale_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    gone, alive = dead_pid(), os.getpid()
    stale_file = tmp_path / f".plan.partial-{gone}-0a1b2c3d.json"
    stale_dir = tmp_path / f"run.partial-{gone}-0a1b2c3d"
    live_dir = tmp_path / f"run.partial-{alive}-0a1b2c3d"
    other = tmp_path / f"other.partial-{gone}-0a1b2c3d"
    old_without_out = tmp_path / f"gone.old-{gone}-0a1b2c3d"  # the only copy left: kept
    for path in (stale_dir, live_dir, other, old_without_out):
        path.mkdir()
    (stale_dir / "requests.parquet").write_text("half")
    stale_file.write_text("half")
    write_file(tmp_path / "plan.json", "{}")
    assert not stale_file.exists() and stale_dir.exists()  # only plan.json's are its business
    AtomicFolder(tmp_path / "run").discard()
    assert not stale_dir.exists() and live_dir.exists() and other.exists()
    assert old_without_out.exists()
    assert remove_stale(tmp_path) == [other]


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_a_locked_temporary_is_not_stale_even_when_its_pid_is_unknown(tmp_path):
    """A writer on another host of a shared folder: its pid means nothing here, its lock does."""
    import fcntl

    foreign = tmp_path / f"run.partial-{dead_pid()}-0a1b2c3d"
    foreign.mkdir()
    fd = os.open(foreign, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_stale(tmp_path) == [] and foreign.exists()
    finally:
        os.close(fd)
    assert remove_stale(tmp_path) == [foreign]


def test_a_run_cleans_the_partial_folders_of_killed_runs_to_its_out(tmp_path):
    outcome = run(RunConfig(trace="mooncake-conversation", max_requests=10))
    killed = tmp_path / f"r.partial-{dead_pid()}-0a1b2c3d"
    killed.mkdir()
    (killed / "requests.parquet").write_text("half")
    write_outputs(outcome, tmp_path / "r")
    assert not killed.exists() and is_complete(tmp_path / "r")
    # a report killed inside the run's folder does not block --overwrite
    (tmp_path / "r" / f"report.partial-{dead_pid()}-0a1b2c3d").mkdir()
    write_outputs(outcome, tmp_path / "r", overwrite=True)
    assert temporaries(tmp_path) == []


# -- full disk: a file-size limit in a subprocess --------------------------------------------------
def test_trace_convert_on_a_full_disk_keeps_the_old_file(tmp_path):
    out = tmp_path / "t.parquet"
    out.write_bytes(b"the previous trace")
    proc = kvsim("trace", "convert", "sharegpt", "-o", str(out), preexec=_limit_files)
    one_line_error(proc.returncode, proc.stderr, str(out), "File too large")
    assert out.read_bytes() == b"the previous trace"
    assert temporaries(tmp_path) == []


def test_import_vidur_on_a_full_disk_writes_nothing(tmp_path):
    out = tmp_path / "p.toml"
    proc = kvsim(*IMPORT, "--out", str(out), preexec=_limit_files)
    one_line_error(proc.returncode, proc.stderr, str(out), "File too large")
    assert list(tmp_path.iterdir()) == []


def test_plan_on_a_full_disk_leaves_no_partial_plan(tmp_path):
    out = tmp_path / "plan"
    proc = kvsim(*PLAN, "--out", str(out), preexec=_limit_files)
    one_line_error(proc.returncode, proc.stderr, str(out), "File too large")
    assert list(tmp_path.iterdir()) == []  # no plan.json cut short, no folder


def test_sweep_resumed_on_a_full_disk_stops_with_one_line(tmp_path):
    out = tmp_path / "sweep"
    run_sweep(expand_spec({"base": {"trace": "mooncake-conversation", "max_requests": 20},
                           "grid": {"policy": ["lru"]}}), out, jobs=1, progress=False)  # fmt: skip
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format("['lru', 'arc']"))
    proc = kvsim("sweep", str(spec), "--out", str(out), "-j", "1", "--quiet", preexec=_limit_files)
    one_line_error(proc.returncode, proc.stderr, "cannot write", "File too large")
    assert temporaries(tmp_path) == []
    assert len(list((out / "runs").iterdir())) == 1  # the finished one kept, nothing half


# -- read-only folders -----------------------------------------------------------------------------
def test_sweep_resumed_into_a_read_only_folder_is_one_line(tmp_path, read_only):
    out = read_only / "sweep"
    read_only.chmod(0o755)
    run_sweep(expand_spec({"base": {"trace": "mooncake-conversation", "max_requests": 20},
                           "grid": {"policy": ["lru"]}}), out, jobs=1, progress=False)  # fmt: skip
    for path in [out, *out.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = sorted(str(p) for p in out.rglob("*"))
    spec = tmp_path / "spec.toml"
    for values in ("['lru']", "['lru', 'arc']"):  # all finished, or one still to run
        spec.write_text(SPEC.format(values))
        proc = kvsim("sweep", str(spec), "--out", str(out), "-j", "1", preexec=_obey_permissions)
        one_line_error(proc.returncode, proc.stderr, f"{out}: cannot write", "Permission denied")
        assert sorted(str(p) for p in out.rglob("*")) == before  # the table still there


@pytest.mark.parametrize(
    "command",
    [
        ["trace", "convert", "sharegpt", "-o", "{ro}/t.parquet"],
        [*IMPORT, "--out", "{ro}/p.toml"],
        [*PLAN, "--out", "{ro}/plan"],
        ["trace", "synth", "sharegpt", "--requests", "5", "-o", "{ro}/s.parquet"],
    ],
    ids=["trace-convert", "import-vidur", "plan", "trace-synth"],
)
def test_writing_into_a_read_only_folder_is_one_line(read_only, command):
    args = [part.replace("{ro}", str(read_only)) for part in command]
    proc = kvsim(*args, preexec=_obey_permissions)
    one_line_error(proc.returncode, proc.stderr, str(read_only), "Permission denied")
    assert list(read_only.iterdir()) == []


# -- import-vidur --out ----------------------------------------------------------------------------
def test_import_vidur_refuses_a_folder_and_an_existing_file_without_overwrite(tmp_path, capsys):
    folder = tmp_path / "taken.toml"
    folder.mkdir()
    code, _, err = in_process(capsys, *IMPORT, "--out", str(folder))
    one_line_error(code, err, str(folder), "is a folder")
    out = tmp_path / "p.toml"
    out.write_text("mine")
    code, _, err = in_process(capsys, *IMPORT, "--out", str(out))
    one_line_error(code, err, str(out), "already exists; pass --overwrite")
    assert out.read_text() == "mine"
    code, _, err = in_process(capsys, *IMPORT, "--out", str(out), "--overwrite")
    assert code == 0, err
    assert "[measured]" in out.read_text()
    assert temporaries(tmp_path) == []


# -- kvsim run --baseline --overwrite --------------------------------------------------------------
def test_overwrite_applies_to_the_baseline_folder_too(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["run", "--trace", "mooncake-conversation", "--max-requests", "10", "--out", str(out)]
    args += ["--baseline", "fifo"]
    code, _, err = in_process(capsys, *args)
    assert code == 0, err
    code, _, err = in_process(capsys, *args)
    one_line_error(code, err, "pass --overwrite")
    code, _, err = in_process(capsys, *args, "--overwrite")
    assert code == 0, err
    assert is_complete(out) and is_complete(tmp_path / "r-baseline")
    (tmp_path / "r-baseline" / "notes.txt").write_text("mine")
    code, _, err = in_process(capsys, *args, "--overwrite")
    one_line_error(code, err, "r-baseline", "even with --overwrite")
    assert "pass --overwrite" not in err  # it was given
    assert (tmp_path / "r-baseline" / "notes.txt").read_text() == "mine"
    assert temporaries(tmp_path) == []


# -- kvsim report written whole --------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    outcome = run(RunConfig(trace="mooncake-conversation", max_requests=10))
    return write_outputs(outcome, tmp_path_factory.mktemp("runs") / "r")


def test_a_report_cut_short_leaves_the_previous_report_whole(run_dir, capsys, monkeypatch):
    code, _, err = in_process(capsys, "report", str(run_dir))
    assert code == 0, err
    report = run_dir / "report"
    before = {p.name: p.read_bytes() for p in report.iterdir()}
    import kvsim.report.page as page

    def full_disk(*args, **kwargs):  # every PNG is written by now; the page is not
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(page, "_markdown", full_disk)
    code, _, err = in_process(capsys, "report", str(run_dir))
    one_line_error(code, err, str(report), "No space left")
    assert {p.name: p.read_bytes() for p in report.iterdir()} == before
    assert temporaries(run_dir) == []
    monkeypatch.undo()
    killed = run_dir / f"report.partial-{dead_pid()}-0a1b2c3d"  # what kill -9 leaves
    killed.mkdir()
    (killed / "latency_cdf.png").write_bytes(b"one figure")
    code, _, err = in_process(capsys, "report", str(run_dir))
    assert code == 0, err
    assert temporaries(run_dir) == []


def test_a_report_does_not_write_into_a_folder_of_other_files(run_dir, tmp_path, capsys):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    code, _, err = in_process(capsys, "report", str(run_dir), "--out", str(mine))
    one_line_error(code, err, "'thesis.tex', which is not a report file")
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]


# -- the sweep's table -----------------------------------------------------------------------------
def test_the_results_table_is_written_whole(tmp_path, monkeypatch):
    from kvsim.sweep.table import write_table

    path = tmp_path / "results.parquet"
    write_table(pd.DataFrame({"id": ["a"]}), path)
    real = pd.DataFrame.to_parquet

    def fail(self, where, *args, **kwargs):
        real(self, where, *args, **kwargs)
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", fail)
    with pytest.raises(WriteError, match="cannot write the results table: Disk quota exceeded"):
        write_table(pd.DataFrame({"id": ["b"]}), path)
    assert pd.read_parquet(path)["id"].tolist() == ["a"]
    assert temporaries(tmp_path) == []
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == '["results.parquet"]'

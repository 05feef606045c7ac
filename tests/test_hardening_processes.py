"""Issue 25, processes left behind: no worker of `kvsim sweep` outlives it.

A real sweep runs in its own session (process group) on a pool of two workers, with
configurations long enough to be running when it is signalled: Ctrl-C (SIGINT to the whole
group, as a terminal sends it), SIGTERM or SIGHUP to the sweep alone, or SIGKILL to the sweep
alone (which nothing can catch: the workers must notice by themselves). Within a bounded time no
process of the group may be left (zombies waiting for init to reap them do not count). Every
test ends by killing whatever is left of the group, so a failure leaves nothing running either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import as_from_a_terminal

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads process groups from /proc"
)

#: Four configurations of a minute or more each: still running when the signal comes.
SPEC = """\
[base]
trace = "sharegpt"
max_requests = 3000
[grid]
policy = ["lru", "arc", "fifo", "s3fifo"]
"""
#: How long the group may take to be gone after the signal (workers poll their parent each 0.5 s).
GONE_WITHIN_S = 20.0
STARTUP_S = 180.0


def group(pgid: int) -> dict[int, str]:
    """The live processes of process group `pgid`: pid -> command line (zombies left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            found[int(entry.name)] = cmdline
    return found


def workers(pgid: int) -> list[int]:
    return [pid for pid, cmd in group(pgid).items() if "spawn_main" in cmd]


@pytest.fixture
def sweep(tmp_path):
    """Start `kvsim sweep -j 2` in a new session; yield (process, its stderr file) once both
    workers are up; kill the whole group afterwards whatever happened."""
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    err = tmp_path / "stderr"
    args = ["sweep", str(spec), "--out", str(tmp_path / "out"), "-j", "2", "--quiet"]
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvsim", *args],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            start_new_session=True,
            preexec_fn=as_from_a_terminal,
        )
    try:
        deadline = time.monotonic() + STARTUP_S
        while len(workers(proc.pid)) < 2:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the pool's workers did not start"
            time.sleep(0.2)
        time.sleep(1.0)  # working (or still importing: both must end)
        yield proc, err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def gone(pgid: int) -> dict[int, str]:
    """Wait up to GONE_WITHIN_S for the group to be empty; what is left of it."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline:
        left = group(pgid)
        if not left:
            return left
        time.sleep(0.2)
    return group(pgid)


def test_ctrl_c_ends_the_sweep_and_its_workers(sweep):
    proc, err = sweep
    os.killpg(proc.pid, signal.SIGINT)  # the terminal signals the whole foreground group
    assert proc.wait(timeout=GONE_WITHIN_S) == 130
    assert gone(proc.pid) == {}
    assert "Traceback" not in err.read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_sweep_alone_stops_its_workers(sweep, signum):
    proc, err = sweep
    os.kill(proc.pid, signum)
    assert proc.wait(timeout=GONE_WITHIN_S) == 128 + signum
    assert gone(proc.pid) == {}
    text = err.read_text()
    assert "Traceback" not in text
    assert f"kvsim: {signal.Signals(signum).name}: stopping the worker processes" in text


def test_workers_exit_by_themselves_when_the_sweep_is_killed(sweep):
    proc, _ = sweep
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert gone(proc.pid) == {}

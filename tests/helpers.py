"""Small canonical traces built by hand for engine tests."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pytest

from kvsim.compiled import compiled_modules
from kvsim.hardware.profile import HardwareProfile
from kvsim.traces.schema import KIND_CODES, Trace, make_trace_table


@dataclass
class Req:
    """One request: its prompt as (hash, tokens) segments and its reply length."""

    segments: Sequence[tuple[int, int]]
    output_tokens: int
    arrival_s: float = 0.0
    session_id: int | None = None
    turn: int = 0
    think_time_s: float | None = None
    output_hash: int = 0
    kinds: Sequence[str] = field(default_factory=tuple)


def make_trace(reqs: Sequence[Req], name: str = "test") -> Trace:
    offsets = np.concatenate(([0], np.cumsum([len(r.segments) for r in reqs]))).astype(np.int64)
    hashes = np.array([h for r in reqs for h, _ in r.segments], dtype=np.uint64)
    tokens = np.array([t for r in reqs for _, t in r.segments], dtype=np.int64)
    kinds = np.array(
        [
            KIND_CODES[(r.kinds[i] if r.kinds else "user")]
            for r in reqs
            for i in range(len(r.segments))
        ],
        dtype=np.uint8,
    )
    n = len(reqs)
    think = np.array([np.nan if r.think_time_s is None else r.think_time_s for r in reqs])
    table = make_trace_table(
        request_id=np.arange(n),
        session_id=np.array(
            [i if r.session_id is None else r.session_id for i, r in enumerate(reqs)]
        ),
        turn=np.array([r.turn for r in reqs]),
        arrival_s=np.array([r.arrival_s for r in reqs], dtype=np.float64),
        think_time_s=think,
        input_tokens=np.array([sum(t for _, t in r.segments) for r in reqs]),
        output_tokens=np.array([r.output_tokens for r in reqs]),
        seg_offsets=offsets,
        seg_hashes=hashes,
        seg_tokens=tokens,
        seg_kinds=kinds,
        output_hash=np.array([r.output_hash for r in reqs], dtype=np.uint64),
        name=name,
        native_block_size=None,
        description="hand-made test trace",
    )
    return Trace.from_table(table)


def same_table(a: pa.Table, b: pa.Table) -> bool:
    """Equal tables, a NaN equal to a NaN in the same cell (a one-token reply has no TPOT);
    pyarrow's `Table.equals` calls two identical runs with a NaN different."""
    return a.schema == b.schema and a.to_pandas().equals(b.to_pandas())


def without_front_end(profile: HardwareProfile) -> HardwareProfile:
    """``profile`` with no per-request front-end overhead, for tests whose expected times are
    the cost model's and the tiers' alone."""
    eff = dataclasses.replace(profile.efficiency, request_overhead_s=0.0)
    return dataclasses.replace(profile, efficiency=eff)


#: the signals a terminal sends, which a child started by `nohup` or from a non-interactive
#: shell's background job inherits as ignored (and Python then never turns SIGINT into Ctrl-C)
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def as_from_a_terminal() -> None:
    """`preexec_fn` for a child that tests how kvsim answers signals: it starts with their
    default actions, as from a terminal, however the test run itself was started."""
    for signum in TERMINAL_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in a process of its own (an example that registers a plugin must not leak
    it into other tests), its output captured."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False
    )


def in_process(capsys, *args: str) -> tuple[int, str, str]:
    """`kvsim ARGS` through the CLI's entry point, in this process: (exit code, stdout, stderr)."""
    from kvsim.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def unless_compiled(module: str) -> pytest.MarkDecorator:
    """Skip a test that patches `module`'s code where the compiled build runs it
    (kvsim.compiled): compiled callers reach its methods and constants directly, past a patch,
    so the test would check nothing."""
    return pytest.mark.skipif(
        module in compiled_modules(), reason=f"patches {module}, which runs compiled here"
    )

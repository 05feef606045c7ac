"""Issue 25, item 5: a cluster run, a P/D run and a compressed run are byte-identical when run
again, whatever Python's string-hash seed.

Each run is a `kvsim run` subprocess (as a user would start it) under a different
``PYTHONHASHSEED``, so a result that leaned on the order of a set or dict of strings, on ``id()``
or on ``hash()`` of a str would differ between them; their requests.parquet and timeline.parquet
files must be equal byte for byte. A few hundred requests keep each run to seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HASH_SEEDS = ("0", "1", "4242")
MODES = {
    "cluster": ["--replicas", "4", "--router", "dynamo-kv"],
    "pd": ["--pd", "2:2", "--router", "dynamo-kv"],
    "compression": ["--compression", "quant:k=4,v=4"],
}


def _run(out: Path, hash_seed: str, extra: list[str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "kvsim",
        "run",
        "--trace",
        "sharegpt",
        "--max-requests",
        "300",
        "--out",
        str(out),
        *extra,
    ]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("mode", list(MODES))
def test_runs_are_byte_identical_across_runs_and_hash_seeds(tmp_path, mode):
    outs = [tmp_path / f"seed-{seed}" for seed in HASH_SEEDS]
    for out, seed in zip(outs, HASH_SEEDS, strict=True):
        _run(out, seed, MODES[mode])
    for name in ("requests.parquet", "timeline.parquet"):
        first = (outs[0] / name).read_bytes()
        for out in outs[1:]:
            assert (out / name).read_bytes() == first, f"{mode}: {out.name}/{name} differs"

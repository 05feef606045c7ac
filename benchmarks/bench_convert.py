"""Benchmark: convert 1 M LMSYS-shaped conversations (generated Parquet) to canonical Parquet.

Reports the time to write the source file (not part of the target), the time and peak memory of
the streaming conversion, and the request count. Target (issue 3): under 60 s and 2 GiB peak.
Reports figures and asserts none. Run: python benchmarks/bench_convert.py [--conversations N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CONVERT = """
import json, resource, sys, time
from kvsim.traces.convert import convert_to_parquet
from kvsim.traces.registry import open_source
t = time.perf_counter()
written, skipped = convert_to_parquet(open_source(sys.argv[1], format="lmsys"), sys.argv[2])
print(json.dumps({"convert_s": time.perf_counter() - t, "requests": written,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from kvsim.traces.lmsys import write_lmsys_parquet

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "lmsys.parquet", Path(tmp) / "canonical.parquet"
        t = time.perf_counter()
        write_lmsys_parquet(src, args.conversations, seed=args.seed)
        write_s = time.perf_counter() - t
        # A fresh process, so the peak RSS is the conversion's alone.
        proc = subprocess.run(
            [sys.executable, "-c", _CONVERT, str(src), str(out)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        figures = json.loads(proc.stdout)
        figures.update(
            conversations=args.conversations,
            source_write_s=write_s,
            source_mib=src.stat().st_size / 2**20,
            output_mib=out.stat().st_size / 2**20,
        )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

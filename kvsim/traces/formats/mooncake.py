"""`mooncake`: Mooncake's JSONL (timestamp, lengths, 512-token prefix hashes), replayed at its
real times (`kvsim.traces.mooncake`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.common import RowErrors
from kvsim.traces.formats.base import JSON_LINES, ReadOptions, TraceFormat
from kvsim.traces.mooncake import load_mooncake
from kvsim.traces.schema import Trace


class Mooncake(TraceFormat):
    name = "mooncake"
    suffixes = JSON_LINES
    catch_all = True  # JSON lines that are neither Dynamo nor kvsim JSONL; its reader says why

    def open(self, path: Path, options: ReadOptions) -> Trace:
        return load_mooncake(path, errors=RowErrors(skip=options.skip_bad_rows))

    def load(self, path: Path, options: ReadOptions) -> Trace:
        """The reader stops after `max_requests` rows and retimes them itself."""
        return load_mooncake(path, max_requests=options.max_requests, rate=options.rate,
                             rate_scale=options.rate_scale,
                             errors=RowErrors(skip=options.skip_bad_rows))  # fmt: skip

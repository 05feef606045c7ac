"""`dynamo`: a Dynamo request-trace JSONL (one `event` per line, gzip or not), replayed at its
real times (`kvsim.traces.dynamo`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.common import Chunked
from kvsim.traces.dynamo import read_dynamo
from kvsim.traces.formats.base import JSON_LINES, Head, ReadOptions, TraceFormat


class Dynamo(TraceFormat):
    name = "dynamo"
    suffixes = JSON_LINES

    def sniff(self, path: Path, head: Head) -> bool:
        row = head.first_json
        return isinstance(row, dict) and "event" in row

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        return read_dynamo(path, skip_bad_rows=options.skip_bad_rows)

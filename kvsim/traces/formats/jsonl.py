"""`jsonl`: kvsim's own JSON lines, one request per line in the canonical table's terms
(`kvsim.traces.jsonl`, docs/traces.md)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.common import Chunked
from kvsim.traces.formats.base import JSON_LINES, Head, ReadOptions, TraceFormat
from kvsim.traces.jsonl import read_jsonl

#: Field names of kvsim JSONL that Mooncake's rows do not have.
_OWN = ("segments", "arrival_s", "output_tokens")


class Jsonl(TraceFormat):
    name = "jsonl"
    suffixes = JSON_LINES

    def sniff(self, path: Path, head: Head) -> bool:
        row = head.first_json
        # A row with Dynamo's `event` is Dynamo's, whatever else it holds.
        return isinstance(row, dict) and "event" not in row and any(k in row for k in _OWN)

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        return read_jsonl(path, skip_bad_rows=options.skip_bad_rows)

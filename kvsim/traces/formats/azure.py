"""`azure`: Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`), replayed at its
real times (`kvsim.traces.azure`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.azure import read_azure
from kvsim.traces.common import Chunked
from kvsim.traces.formats.base import CsvFormat, ReadOptions


class Azure(CsvFormat):
    name = "azure"
    column = "ContextTokens"
    label = "Azure"

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        return read_azure(path, skip_bad_rows=options.skip_bad_rows)

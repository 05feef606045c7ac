"""`burstgpt`: BurstGPT CSV (`Timestamp,Model,Request tokens,Response tokens,...`), replayed at
its real times (`kvsim.traces.burstgpt`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.burstgpt import read_burstgpt
from kvsim.traces.common import Chunked
from kvsim.traces.formats.base import CsvFormat, ReadOptions


class BurstGPT(CsvFormat):
    name = "burstgpt"
    column = "Request tokens"
    label = "BurstGPT"

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        return read_burstgpt(path, skip_bad_rows=options.skip_bad_rows)

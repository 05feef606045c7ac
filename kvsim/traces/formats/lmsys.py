"""`lmsys`: LMSYS-Chat-1M Parquet (a `conversation` column of {content, role}), streamed in
batches; prompts counted with the tokenizer, session starts drawn (`kvsim.traces.chat`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.chat import ChatTiming, read_lmsys
from kvsim.traces.common import Chunked
from kvsim.traces.formats.base import ChatFormat, Head, ReadOptions
from kvsim.traces.text import make_counter


class Lmsys(ChatFormat):
    name = "lmsys"
    suffixes = (".parquet",)

    def sniff(self, path: Path, head: Head) -> bool:
        columns = head.parquet_columns
        return "conversation" in columns and "segments" not in columns

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        return read_lmsys(path, counter=make_counter(options.tokenizer),
                          timing=ChatTiming.default(options.seed, options.rate or 1.0),
                          skip_bad_rows=options.skip_bad_rows)  # fmt: skip

"""`sharegpt`: a ShareGPT JSON array of conversations, streamed; prompts counted with the
tokenizer, session starts drawn (`kvsim.traces.chat`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.chat import ChatTiming, read_sharegpt_json
from kvsim.traces.common import Chunked
from kvsim.traces.formats.base import ChatFormat, ReadOptions
from kvsim.traces.text import make_counter


class ShareGPT(ChatFormat):
    name = "sharegpt"
    suffixes = (".json",)
    catch_all = True  # any JSON document

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        return read_sharegpt_json(path, counter=make_counter(options.tokenizer),
                                  timing=ChatTiming.default(options.seed, options.rate or 1.0),
                                  skip_bad_rows=options.skip_bad_rows)  # fmt: skip

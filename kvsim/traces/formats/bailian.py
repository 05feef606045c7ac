"""`qwen-bailian`: the public Qwen/Bailian usage-trace JSONL of "KVCache Cache in the Wild"
(chat and parent ids, request types, 16-token block ids), replayed at its real times
(`kvsim.traces.bailian`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.bailian import load_bailian
from kvsim.traces.common import RowErrors
from kvsim.traces.formats.base import JSON_LINES, Head, ReadOptions, TraceFormat
from kvsim.traces.schema import Trace


class QwenBailian(TraceFormat):
    name = "qwen-bailian"
    suffixes = JSON_LINES

    def sniff(self, path: Path, head: Head) -> bool:
        row = head.first_json
        # Mooncake rows share timestamp, lengths and hash_ids, but have no chat_id.
        return isinstance(row, dict) and "event" not in row and "chat_id" in row

    def open(self, path: Path, options: ReadOptions) -> Trace:
        return load_bailian(path, errors=RowErrors(skip=options.skip_bad_rows))

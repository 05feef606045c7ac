"""`swe-agent`: SWE-agent trajectories, one `.traj` file or a folder of them, one session each;
prompts counted with the tokenizer (`kvsim.traces.swe_agent`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.traces.common import Chunked
from kvsim.traces.formats.base import Head, ReadOptions, TraceFormat
from kvsim.traces.swe_agent import read_swe_agent
from kvsim.traces.text import make_counter


class SweAgent(TraceFormat):
    name = "swe-agent"
    suffixes = (".traj",)
    folders = True

    def sniff(self, path: Path, head: Head) -> bool:
        return not head.is_dir or any(path.glob("*.traj"))

    def unrecognized(self, path: Path, head: Head, candidates: list[TraceFormat]) -> str | None:
        return f"{path}: a directory without .traj files" if head.is_dir else None

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        return read_swe_agent(path, counter=make_counter(options.tokenizer),
                              skip_bad_rows=options.skip_bad_rows)  # fmt: skip

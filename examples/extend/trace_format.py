"""Adding a trace format: one reader class, registered, then loaded by `load_trace` like any other.

The format here, `reqlog`, is made up for the example. Its first line is `# reqlog system=N`; each
further line is one request, `ARRIVAL_S SESSION PROMPT_TOKENS OUTPUT_TOKENS`. Every prompt starts
with the same N-token system prompt (one segment with one hash, so its KV is shared), followed by
the user's own tokens.

A reader names its format, says which file names to ask it about (`suffixes`), tells its files
from others by their first bytes (`sniff`), and reads one (`open`) into request columns. kvsim
does the rest: detection, `--trace-format reqlog`, and the options every format takes (`rate`,
`rate_scale`, `max_requests`, other arrival models), through `load_trace` or `kvsim trace convert`.

Inside kvsim the class goes in a file of its own under kvsim/traces/formats/ and one line in that
package's `__init__` registers it. A package outside kvsim declares it in its pyproject.toml
instead, and then the command line finds it too:

    [project.entry-points."kvsim.trace_formats"]
    reqlog = "my_package.reqlog:ReqLog"

Run: python examples/extend/trace_format.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.textio import read_utf8
from kvsim.traces import load_trace
from kvsim.traces.common import Chunked, Requests, RowErrors
from kvsim.traces.formats import Head, ReadOptions, TraceFormat, detect_format, register
from kvsim.traces.jsonl import string_hash
from kvsim.traces.schema import KIND_CODES


class ReqLog(TraceFormat):
    name = "reqlog"
    suffixes = (".reqlog",)

    def sniff(self, path: Path, head: Head) -> bool:
        return head.first_line.startswith("# reqlog ")

    def open(self, path: Path, options: ReadOptions) -> Chunked:
        lines = read_utf8(path, str(path), TraceError).splitlines() or [""]  # one-line errors
        header = lines[0].partition("system=")[2]
        if not header.isdigit():
            raise TraceError(f"{path}:1: expected the header '# reqlog system=TOKENS'")
        system = int(header)
        errors = RowErrors(skip=options.skip_bad_rows)  # raises, or counts and goes on
        rows: list[tuple[float, str, int, int]] = []
        for line_no, line in enumerate(lines[1:], start=2):
            fields = line.split()
            if len(fields) != 4 or not (fields[2].isdigit() and fields[3].isdigit()):
                errors.bad(f"{path}:{line_no}: expected ARRIVAL_S SESSION PROMPT OUTPUT")
                continue
            rows.append((float(fields[0]), fields[1], int(fields[2]), int(fields[3])))
        session_ids: dict[str, int] = {}  # numbered in order of first appearance
        turns_so_far: dict[str, int] = {}
        session, turn = [], []
        for _, name, _, _ in rows:
            session.append(session_ids.setdefault(name, len(session_ids)))
            turn.append(turns_so_far.get(name, 0))
            turns_so_far[name] = turn[-1] + 1
        n = len(rows)
        user = np.array([r[2] for r in rows], np.int64)
        # Equal hashes mean equal content: every system prompt is the same, no user's text is.
        own = np.array([string_hash(f"{r[1]}/{i}") for i, r in enumerate(rows)], np.uint64)
        requests = Requests(
            session_id=np.array(session, np.int64),
            turn=np.array(turn, np.int64),
            arrival_s=np.array([r[0] for r in rows], np.float64),
            think_time_s=np.full(n, np.nan),  # open loop: each request at its own time
            input_tokens=system + user,
            output_tokens=np.array([r[3] for r in rows], np.int64),
            # Two segments per request: the shared system prompt, then the user's own tokens.
            seg_offsets=np.arange(0, 2 * n + 1, 2, dtype=np.int64),
            seg_hashes=np.column_stack([np.full(n, string_hash("system"), np.uint64), own]).ravel(),
            seg_tokens=np.column_stack([np.full(n, system), user]).ravel(),
            seg_kinds=np.tile([KIND_CODES["system"], KIND_CODES["user"]], n).astype(np.uint8),
            output_hash=np.zeros(n, np.uint64),  # replies are not content-addressed here
        )
        description = f"reqlog {path.name}: real arrivals and lengths, one shared system prompt"
        # One chunk with every row; np.inf: no later chunk holds an earlier arrival.
        return Chunked(iter([(requests, np.inf)]), path.stem, None, description, errors)


register(ReqLog)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.reqlog"
        path.write_text(
            "# reqlog system=800\n"
            "0.0 alice 40 20\n"
            "0.5 bob 25 30\n"
            "2.0 alice 60 10\n"
        )  # fmt: skip
        print("detected format:", detect_format(path))
        trace = load_trace(path)
        print(f"{trace.name}: {len(trace)} requests; {trace.description}")
        columns = ["request_id", "session_id", "turn", "arrival_s", "input_tokens"]
        print(trace.table.select(columns).to_pandas().to_string(index=False))
        twice = load_trace(path, rate_scale=2.0, max_requests=2)
        print("rate_scale=2, max_requests=2: arrivals",
              twice.table.column("arrival_s").to_pylist())  # fmt: skip


if __name__ == "__main__":
    main()

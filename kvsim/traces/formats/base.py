"""The reader contract every trace file format implements, and the two shapes built-ins share.

A format is one class: a `name`, the file name endings it reads (`suffixes`), `sniff` to tell its
files from others with the same ending by their first bytes, and `open` to read a file as a
stream of chunks or a whole `Trace`. `load` applies the timing options and rarely needs
overriding. Detection and lookup by name are in `kvsim.traces.formats`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.errors import TraceError
from kvsim.textio import decode_utf8, one_line, parse_json
from kvsim.traces.common import Chunked, iter_lines
from kvsim.traces.replay import collect, replay
from kvsim.traces.schema import Trace

__all__ = ["JSON_LINES", "ChatFormat", "CsvFormat", "Head", "ReadOptions", "TraceFormat"]

#: The name endings of line-delimited JSON, plain or gzip-compressed.
JSON_LINES = (".jsonl", ".jsonl.gz", ".gz")


@dataclass(frozen=True)
class ReadOptions:
    """What a caller of `load_trace` or `open_source` asked for, checked already."""

    max_requests: int | None = None  # keep the first N requests by arrival (`load` only)
    rate: float | None = None  # session starts per second (replayed: stretch times to it)
    rate_scale: float = 1.0  # divides every arrival time (`load` only)
    seed: int = 0  # for drawn times
    skip_bad_rows: bool = False  # count malformed rows instead of failing
    tokenizer: str | os.PathLike[str] | None = None  # tokenizer.json for text formats


class Head:
    """What detection may look at: the path's name and its first bytes, read once, on demand.

    Each property reads only when first asked, so a format whose name ending does not match
    costs nothing; a file that cannot be read raises a one-line TraceError naming it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name.lower()
        self.is_dir = path.is_dir()

    @cached_property
    def first_line(self) -> str:
        """The first line as text (a CSV header)."""
        try:
            with self.path.open("rb") as handle:
                return decode_utf8(handle.readline(), str(self.path), TraceError)
        except OSError as exc:
            raise TraceError(f"{self.path}: cannot open: {exc.strerror or exc}") from None

    @cached_property
    def parquet_columns(self) -> list[str]:
        """The column names of a Parquet file."""
        try:
            return pq.ParquetFile(self.path).schema_arrow.names
        except (OSError, ValueError, pa.ArrowException) as exc:  # ValueError: bad UTF-8
            raise TraceError(f"{self.path}: cannot read as Parquet: {one_line(exc)}") from None

    @cached_property
    def first_json(self) -> object:
        """The first non-blank line (gzip or not) as JSON: {} for none, None for bad JSON (the
        format's own reader then reports the bad line)."""
        try:
            first = next((raw for _, raw in iter_lines(self.path, str(self.path)) if raw.strip()),
                         b"")  # fmt: skip
            return parse_json(first) if first else {}
        except ValueError:
            return None


class TraceFormat:
    """One trace file format; subclass it, set the class attributes, write `open`."""

    #: The name `--trace-format` and `load_trace(format=...)` take.
    name: ClassVar[str] = ""
    #: File name endings (lower case) detection asks this format about: (".csv",).
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: True when a folder can be a trace in this format (detection then asks about folders).
    folders: ClassVar[bool] = False
    #: True when `sniff` takes any file its `suffixes` match: asked after every other format.
    catch_all: ClassVar[bool] = False

    def sniff(self, path: Path, head: Head) -> bool:
        """Whether `path`, whose name ends in one of `suffixes`, is in this format."""
        return True

    def unrecognized(self, path: Path, head: Head, candidates: list[TraceFormat]) -> str | None:
        """The error when `path` matched the `suffixes` of `candidates` (this one first) but
        none took it; None: the generic one, listing every format."""
        return None

    def open(self, path: Path, options: ReadOptions) -> Chunked | Trace:
        """`path` as a stream of chunks (for streaming conversion) or a whole Trace.

        Only `seed`, `rate` (drawn session starts), `tokenizer` and `skip_bad_rows` apply here.
        """
        raise NotImplementedError

    def load(self, path: Path, options: ReadOptions) -> Trace:
        """`path` as a Trace with every option applied: the file's own times, stretched to
        `rate` and divided by `rate_scale`, then the first `max_requests`."""
        source = self.open(path, options)
        return replay(source if isinstance(source, Trace) else collect(source), options)


class CsvFormat(TraceFormat):
    """A CSV format told apart from the others by a column name in its header line."""

    suffixes = (".csv",)
    #: A column name only this format's header has.
    column: ClassVar[str] = ""
    #: How the unknown-header error names this format: "Azure".
    label: ClassVar[str] = ""

    def sniff(self, path: Path, head: Head) -> bool:
        return self.column in head.first_line

    def unrecognized(self, path: Path, head: Head, candidates: list[TraceFormat]) -> str | None:
        labels = " or ".join(c.label for c in candidates if isinstance(c, CsvFormat))
        return f"{path}:1: unknown CSV header; expected {labels} columns"


class ChatFormat(TraceFormat):
    """Conversations as text: prompts are counted with the tokenizer and session starts are
    drawn (there are no real times), so `rate` and `rate_scale` set the drawn rate instead of
    stretching times."""

    def load(self, path: Path, options: ReadOptions) -> Trace:
        drawn = replace(options, rate=(options.rate or 1.0) * options.rate_scale)
        source = self.open(path, drawn)
        assert isinstance(source, Chunked)
        return collect(source, options.max_requests)

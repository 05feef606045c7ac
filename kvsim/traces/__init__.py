"""Traces: every source format becomes one canonical Arrow table (see `schema`).

`load_trace(name_or_path)` is the entry point; `block_hashes` derives per-block prefix hashes from a
request's segments at any block size.
"""

from kvsim.traces.blocks import (
    batch_block_hashes,
    block_hashes,
    block_kinds,
    sequence_block_hashes,
)
from kvsim.traces.registry import load_trace, register_trace, trace_names, traces_dir
from kvsim.traces.schema import (
    KIND_CODES,
    SEGMENT_KINDS,
    TRACE_SCHEMA,
    SegmentColumns,
    Trace,
    make_trace_table,
    read_trace,
    segment_columns,
    validate_trace,
    write_trace,
)

__all__ = [
    "KIND_CODES",
    "SEGMENT_KINDS",
    "TRACE_SCHEMA",
    "SegmentColumns",
    "Trace",
    "batch_block_hashes",
    "block_hashes",
    "block_kinds",
    "load_trace",
    "make_trace_table",
    "read_trace",
    "register_trace",
    "segment_columns",
    "sequence_block_hashes",
    "trace_names",
    "traces_dir",
    "validate_trace",
    "write_trace",
]

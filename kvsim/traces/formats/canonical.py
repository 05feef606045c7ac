"""`canonical`: kvsim's own Parquet table (`kvsim.traces.schema`), as `write_trace` and
`kvsim trace convert` write it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from kvsim.errors import KvsimError
from kvsim.traces.formats.base import ReadOptions, TraceFormat
from kvsim.traces.schema import Trace, read_trace


class Canonical(TraceFormat):
    name = "canonical"
    suffixes = (".parquet",)
    catch_all = True  # any Parquet file that is not LMSYS

    def open(self, path: Path, options: ReadOptions) -> Trace:
        return read_trace(path, options.skip_bad_rows, options.max_requests)

    def load(self, path: Path, options: ReadOptions) -> Trace:
        """Stored times: `rate_scale` divides them; `rate` has no span to stretch to."""
        if options.rate is not None:
            raise KvsimError(
                f"option 'rate' does not apply to a stored trace ({path}); use 'rate_scale'"
            )
        table = self.open(path, options).table
        if options.max_requests is not None:
            table = table.slice(0, options.max_requests)
        if options.rate_scale != 1.0:
            index = table.schema.get_field_index("arrival_s")
            scaled = np.asarray(table.column("arrival_s").to_numpy()) / options.rate_scale
            table = table.set_column(
                index, table.schema.field(index), pa.array(scaled, pa.float64())
            )
        return Trace.from_table(table, str(path))

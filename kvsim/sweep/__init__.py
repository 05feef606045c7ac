"""Sweeps: many engine runs, locally or on Ray, resumable, into one results table.

`kvsim sweep SPEC.toml --out DIR` is `run_sweep`; the spec format is in `kvsim.sweep.spec`.
Other tools (`kvsim plan`) call the executors directly:

    from kvsim.sweep import run_many, open_executor, results_table
    results = run_many(configs, executor="local", jobs=4)        # list[ConfigResult], in order
    results[0].summary["ttft_p99_s"], results[0].ok, results[0].error

    with open_executor("ray", ray_address="auto") as ex:         # kept open: workers keep traces
        first = run_many(batch1, executor=ex)
        second = run_many(batch2, executor=ex, out="plan/")     # written, and resumable

`run_many(configs, *, executor="local"|"ray"|Executor, jobs=None, ray_address=None, out=None,
params=None, keep_requests=False, progress=True) -> list[ConfigResult]`:

- checks every config before running any (a `ConfigError` naming the configuration);
- runs equal configs once; returns one `ConfigResult` per config, in the configs' order, with
  ``status`` "ok" (``summary``: the run's summary, JSON-safe, plus ``summary["sweep"]`` =
  run_s, peak_rss_bytes, worker) or "failed" (``error``: one line; the others carry on); a
  run that completed no request is "failed" with the reason, its ``summary`` kept;
- with ``out``, writes each run to ``out/runs/<id>/`` as it finishes and skips those already
  there (resume); without, writes nothing. A folder that cannot be written is one WriteError
  line, before any run or, for a write that fails later, stopping the sweep;
- `jobs` defaults to the CPU count; 'local' with one job runs in this process, else on a spawn
  process pool; 'ray' starts a local Ray of `jobs` CPUs, or joins `ray_address`.
- the pool's workers never outlive the sweep: Ctrl-C, SIGTERM or SIGHUP end them with it, and
  each worker exits by itself within a second when its parent dies (``kill -9``).

`results_table(results)` is the pandas table (one row per configuration: id, status, error,
parameters, flattened summary; see `kvsim.sweep.table`), `write_table` writes it atomically.
Same configs, same table, bit for bit, apart from `MEASURED_COLUMNS`, on any executor.
"""

from kvsim.sweep.executors import (
    EXECUTORS,
    Executor,
    LocalExecutor,
    RayExecutor,
    SweepError,
    open_executor,
)
from kvsim.sweep.runner import RESULTS_FILE, ConfigResult, run_many, run_sweep
from kvsim.sweep.spec import Configuration, config_id, expand_spec, flat_config, load_spec
from kvsim.sweep.table import MEASURED_COLUMNS, flatten, results_table, write_table

__all__ = [
    "EXECUTORS",
    "MEASURED_COLUMNS",
    "RESULTS_FILE",
    "ConfigResult",
    "Configuration",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "SweepError",
    "config_id",
    "expand_spec",
    "flat_config",
    "flatten",
    "load_spec",
    "open_executor",
    "results_table",
    "run_many",
    "run_sweep",
    "write_table",
]

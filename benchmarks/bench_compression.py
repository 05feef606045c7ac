"""Does KV compression slow the engine? Wall time of the whole mooncake-conversation trace.

    python benchmarks/bench_compression.py                      # none vs quant:k=4,v=4, best of 2
    python benchmarks/bench_compression.py --profiles "none;h2o;streaming" --repeats 1
    python benchmarks/bench_compression.py --same-schedule  # HBM only, equal block counts
    python benchmarks/bench_compression.py --side-by-side   # each round's profiles at once

Each run is `kvsim.run.run` on the whole trace (all 12,031 requests: ``max_requests`` set past
its length), the trace loaded once and reused; ``--repeats`` rounds each run every profile once,
in turn (every other round in reverse order: a run after another in the same process may be
slower), so a slow spell of a shared machine hits them alike. Prints a table of wall and CPU time
(best of the rounds; CPU time is this process's, steadier than wall time on a shared machine),
simulated time, iterations, KV blocks, GB and blocks loaded from lower tiers, the HBM block
operations and evictions, and TTFT/TPOT p50 per profile (the block counts are the engine's work:
benchmarks/dict_lookup_latency.py measures what each costs as the tables grow).
``--same-schedule`` gives every profile HBM only and the uncompressed run's block count, so the
schedules match and the difference is the compression machinery's own cost. ``--side-by-side``
runs each round's profiles at the same time, one process each (forked: the trace is loaded
once), so on a shared machine whose speed drifts over minutes both see the same spell; give it
no more profiles than cores. Asserts nothing:
the figures go in docs/compression.md ("Does compression slow the engine?").
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

WHOLE = 1_000_000  # more requests than the trace has: replay all of them
_FORKED: dict = {}  # the trace and configurations, inherited by --side-by-side's processes


def _timed(text: str) -> tuple[str, float, float, dict]:
    """(profile, wall s, CPU s, summary) of one run of a profile set up in `_FORKED`."""
    from kvsim.run import run

    start, cpu = time.perf_counter(), time.process_time()
    summary = run(_FORKED["configs"][text], trace=_FORKED["trace"]).summary
    return text, time.perf_counter() - start, time.process_time() - cpu, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conversation")
    parser.add_argument("--profiles", default="none;quant:k=4,v=4", help="';'-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-requests", type=int, default=WHOLE)
    parser.add_argument("--same-schedule", action="store_true")
    parser.add_argument("--side-by-side", action="store_true")
    args = parser.parse_args()

    from kvsim.engine.config import EngineConfig
    from kvsim.engine.resolve import resolve_engine
    from kvsim.hardware import load_profile
    from kvsim.models import load_model
    from kvsim.run import RunConfig, trace_options
    from kvsim.traces import load_trace

    base = RunConfig(trace=args.trace, max_requests=args.max_requests)
    trace = load_trace(base.trace, **trace_options(base))
    rows = []
    same: dict = {}
    if args.same_schedule:
        none = resolve_engine(base.engine, load_model(base.model), load_profile(base.hardware))
        blocks = none.num_blocks
        same = {"tiers": "hbm", "num_gpu_blocks": blocks}
    texts = [p.strip() for p in args.profiles.split(";") if p.strip()]
    configs = {
        text: RunConfig(
            trace=args.trace,
            max_requests=args.max_requests,
            engine=EngineConfig(compression=text, **same),
        )
        for text in texts
    }
    walls: dict[str, list[float]] = {text: [] for text in texts}
    cpus: dict[str, list[float]] = {text: [] for text in texts}
    summaries: dict[str, dict] = {}
    _FORKED.update(trace=trace, configs=configs)
    for round_ in range(args.repeats):  # rounds alternate the profiles: a slow spell hits
        if args.side_by_side:  # them alike; a fresh process per run, all of a round's at once
            fork = multiprocessing.get_context("fork")
            with fork.Pool(len(texts), maxtasksperchild=1) as pool:
                timed = pool.map(_timed, texts, chunksize=1)
        else:  # one process: every other round reversed, so neither always runs first
            timed = [_timed(text) for text in (texts[::-1] if round_ % 2 else texts)]
        for text, wall, cpu, summary in timed:
            summaries[text] = summary
            walls[text].append(wall)
            cpus[text].append(cpu)
    for text in texts:
        summary = summaries[text]
        loaded = sum(t["bytes_read"] for t in summary["tiers"].values()) / 1e9
        rows.append(
            (
                text,
                min(walls[text]),
                min(cpus[text]),
                loaded,
                summary["requests"],
                summary["simulated_s"],
                summary["iterations"],
                summary["kv_blocks"],
                summary["ttft_p50_s"] * 1000,
                summary["tpot_p50_s"] * 1000,
                summary["preemptions"],
                loaded * 1e9 / summary["kv_block_bytes_per_rank"] / 1e6,
                summary["block_ops"] / 1e6,
                summary["evicted_blocks"] / 1e6,
            )
        )
    head = ("profile", "wall s", "cpu s", "GB loaded", "requests", "sim s", "iterations",
            "KV blocks", "TTFT p50 ms", "TPOT p50 ms", "preemptions", "M blocks loaded",
            "M HBM block ops", "M evictions")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        print(
            f"{r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:,.1f} | {r[4]:,} | {r[5]:,.0f} | {r[6]:,}"
            f" | {r[7]:,} | {r[8]:,.1f} | {r[9]:.2f} | {r[10]:,} | {r[11]:.2f} | {r[12]:.1f}"
            f" | {r[13]:.2f}"
        )
    for text in texts:
        print(f"{text}: wall s per round " + ", ".join(f"{w:.1f}" for w in walls[text]))
    if len(texts) > 1:  # each round's ratio to the first profile, the same machine state
        first = walls[texts[0]]
        for text in texts[1:]:
            ratios = [w / f for w, f in zip(walls[text], first, strict=True)]
            print(
                f"{text} / {texts[0]} per round: "
                + ", ".join(f"{r:.3f}" for r in ratios)
                + f"; median {statistics.median(ratios):.3f}"
            )


if __name__ == "__main__":
    main()

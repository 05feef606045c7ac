"""Microbenchmarks: time each kernel family at a sweep of sizes, in forward-pass conditions.

Timing each op back to back on warm operands predicted a forward pass badly (docs/calibration.md
has the measurements), so:

- Where the decoder can run the model, GEMMs, elementwise work and attention are timed *inside*
  single decoder layers (``layer_sampler``), with a stamp after every op, cycling through enough
  layer copies that weights and KV caches come back as cold as in the whole forward pass.
  Otherwise (MLA) and for the LM head, each kernel is timed alone after a cache scrub
  (``Timer.once``).
- Every point, forward passes included, is timed in interleaved rounds (``measure``) so a
  shared machine's slow phases fall on all of them alike.
- On a CPU with one torch thread, times are the thread's CPU time (``cpu_clock``), which
  another process's time slices do not inflate; GPU times are CUDA events.

Medians are stored with the spread (interquartile range over the median). Host/device copies
keep back-to-back timing.
"""

from __future__ import annotations

import itertools
import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kvsim.calibrate.ops import (
    AttnShape,
    LayerWeights,
    decode_batch,
    elementwise_pieces,
    mla_decode,
    prefill_chunk,
    randn,
    rope_tables,
)
from kvsim.costmodel.shapes import GemmShape

MiB = 1 << 20


@dataclass(frozen=True)
class Timing:
    """Median seconds of one call and the relative interquartile spread."""

    seconds: float
    spread: float


def cpu_clock() -> tuple[Callable[[], float], float]:
    """The clock CPU timings read, and the seconds one reading costs (subtracted per stamp).

    With one torch thread, the thread's CPU time: on a shared machine another process takes
    the core in slices of milliseconds, which a wall clock charges to long calls (a whole
    forward pass) far more often than to short ones (one op), so sums of ops came out 1.5-2x
    below forward passes under a load of 3 on 2 cores. With more threads, the wall clock.
    """
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    reads = []
    for _ in range(5):
        start = clock()
        for _ in range(200):
            clock()
        reads.append((clock() - start) / 201)
    return clock, statistics.median(reads)


def last_level_cache_bytes(device: torch.device) -> int:
    """Size of the cache a kernel's operands can stay warm in: the GPU's L2, or the CPU's
    largest cache level (sysfs); 64 MiB when the machine does not say."""
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or 64 * MiB
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or 64 * MiB


def device_memory_bytes(device: torch.device) -> int:
    """Memory of the device: the GPU's, or the machine's physical memory for a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


Piece = tuple[Callable[[], Any], tuple[torch.Tensor, ...]]  # a call and the activations it reads


class Timer:
    """Times calls on one device.

    ``once`` times one call in forward-pass cache state: with ``scrub_bytes`` > 0 it first
    scrubs the caches and reads the call's activations back in. ``__call__`` times calls back
    to back in repetitions of about ``target_s`` (for copies, whose operands are large anyway).
    """

    def __init__(
        self,
        device: torch.device,
        warmup: int,
        reps: int,
        target_s: float,
        scrub_bytes: int = 0,
    ) -> None:
        self.device, self.warmup, self.reps, self.target_s = device, warmup, reps, target_s
        self.cuda = device.type == "cuda"
        self.clock, self.clock_cost = (time.perf_counter, 0.0) if self.cuda else cpu_clock()
        self.scrub = (
            torch.zeros(max(1, scrub_bytes // 4), dtype=torch.int32, device=device)
            if scrub_bytes > 0
            else None
        )

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def once(self, fn: Callable[[], Any], warm: Sequence[torch.Tensor] = ()) -> float:
        """Seconds of one call of ``fn`` after the caches are scrubbed (plain stores, which
        allocate in cache, unlike a large memset's streaming ones) and ``warm`` is read back
        in as the previous op would have left it. On a GPU the scrub and the reads are queued
        before the start event, so the events bracket only the call."""
        if self.scrub is not None:
            self.scrub.add_(1)
        for t in warm:
            t.sum()
        if self.cuda:
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 1000.0
        start = self.clock()
        fn()
        return max(self.clock() - start - self.clock_cost, 1e-9)

    def __call__(self, fn: Callable[[], Any]) -> Timing:
        """Median per call over ``reps`` back-to-back repetitions of about ``target_s``."""
        for _ in range(self.warmup):
            fn()
        self._sync()
        start = time.perf_counter()
        fn()
        self._sync()
        first = max(time.perf_counter() - start, 1e-7)
        inner = max(1, min(200, int(self.target_s / first)))
        samples = []
        for _ in range(self.reps):
            if self.cuda:
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                samples.append(begin.elapsed_time(end) / 1000.0 / inner)
            else:
                start = self.clock()
                for _ in range(inner):
                    fn()
                samples.append((self.clock() - start) / inner)
        return summarize(samples)


Sample = dict[str, float]  # seconds of one call, by part


@dataclass(frozen=True)
class Probe:
    """One measured point: ``build`` makes its tensors and returns a sampler, whose every call
    times the point once, by part. ``keep`` holds the tensors across rounds; a large one (a
    forward pass's KV caches) is rebuilt each round instead. ``settle`` untimed calls start
    each round: the first call after other shapes ran finds the allocator holding blocks of
    the wrong sizes and pays for fresh pages (measured: qwen2.5-0.5b decode attention at
    B=16, C=64 took 1.35 ms so, 0.32 ms settled), which a forward pass, where every layer
    repeats the shapes of the one before, does not."""

    build: Callable[[], Callable[[], Sample]]
    keep: bool = True
    settle: int = 1  # untimed calls each round, before the timed ones


def pieces_sampler(timer: Timer, pieces: list[Piece]) -> Callable[[], Sample]:
    """A sampler timing each piece on its own in forward-pass cache state (``Timer.once``)."""
    return lambda: {f"piece{j}": timer.once(fn, warm) for j, (fn, warm) in enumerate(pieces)}


Progress = Callable[[int, int, float], None]  # (visits done, visits in all, seconds left)


def measure(
    probes: list[Probe],
    rounds: int,
    reps: int,
    warmup: int,
    target_s: float,
    progress: Progress | None = None,
) -> list[dict[str, Timing]]:
    """Time every probe ``rounds`` times over, interleaved: ``reps`` calls a round, or up to 8x
    as many when that many fit in ``target_s``. Returns each probe's median time by part.

    A shared machine drifts between fast and slow phases lasting seconds (measured: medians
    over 1.5 s windows of one forward pass varied 1.8x on the 2-core build box). Visiting every
    point once per round, in alternating order, spreads those phases over the kernels and the
    forward passes alike, so their medians stay comparable.

    ``progress`` is called after every visit with the visits done, the visits in all and the
    seconds of timing left: in the first round a visit not yet made costs the mean first visit
    so far (building, warming up, timing); a later visit of a kept probe costs its calls (and
    the settling one) at the seconds per call of its last visit, a rebuilt probe's its whole
    last visit; probes not yet visited, the mean of those that were.
    """
    built: list[Callable[[], Sample] | None] = [None] * len(probes)
    samples: list[dict[str, list[float]]] = [{} for _ in probes]
    calls: list[int] = [reps] * len(probes)
    settle: list[int] = [p.settle for p in probes]
    visit0: list[float | None] = [None] * len(probes)  # wall seconds of each first visit
    later: list[float | None] = [None] * len(probes)  # ... expected of each later visit
    visits, done = rounds * len(probes), 0
    for r in range(rounds):
        order = range(len(probes)) if r % 2 == 0 else range(len(probes) - 1, -1, -1)
        for i in order:
            started = time.perf_counter()
            sampler = built[i]
            if sampler is None:
                sampler = probes[i].build()
                first = 1e-7
                for _ in range(warmup):
                    first = max(sum(sampler().values()), 1e-7)
                if probes[i].keep:
                    built[i] = sampler
                if r == 0:  # short calls get more samples: cheap, and steadier
                    calls[i] = max(reps, min(8 * reps, int(target_s / first)))
                    if first > 10 * target_s:  # long enough to settle itself as it runs
                        settle[i] = 0
            timed = time.perf_counter()
            for _ in range(settle[i] if r else 0):
                sampler()
            for _ in range(calls[i]):
                for part, seconds in sampler().items():
                    samples[i].setdefault(part, []).append(seconds)
            del sampler
            now = time.perf_counter()
            visit0[i] = now - started if r == 0 else visit0[i]
            per_call = (now - timed) / (calls[i] + (settle[i] if r else 0))
            later[i] = per_call * (calls[i] + settle[i]) if probes[i].keep else now - started
            done += 1
            if progress is not None:
                progress(done, visits, _seconds_left(visit0, later, r, rounds, done))
    return [{part: summarize(v) for part, v in s.items()} for s in samples]


def _seconds_left(
    visit0: list[float | None], later: list[float | None], r: int, rounds: int, done: int
) -> float:
    """Estimated seconds of the visits ``measure`` has left (see there)."""

    def known(values: list[float | None]) -> list[float]:
        seen = [v for v in values if v is not None]
        mean = sum(seen) / len(seen)
        return [mean if v is None else v for v in values]

    n = len(later)
    made = done - r * n  # visits of round r made; odd rounds go backwards
    pending = range(made, n) if r % 2 == 0 else range(n - made)
    cost = known(later)
    this_round = known(visit0) if r == 0 else cost
    return sum(this_round[i] for i in pending) + sum(cost) * (rounds - r - 1)


def total(parts: dict[str, Timing]) -> Timing:
    """The sum of parts' medians, with their time-weighted spread."""
    seconds = sum(t.seconds for t in parts.values())
    return Timing(seconds, sum(t.spread * t.seconds for t in parts.values()) / seconds)


def layer_sampler(
    decoder: Any, batch: Any, device: torch.device, copies: int | None = None
) -> Callable[[], Sample]:
    """Per-part seconds (GEMM roles, elementwise, attention) of one decoder layer on ``batch``.

    Each call runs the next of the decoder's first ``copies`` layers (default: all), so a
    copy's weights and KV cache are as cold when it comes round again as a layer's are in a
    whole forward pass, and each op runs right after the op before it, as in the forward. Op
    boundaries are CUDA events on a GPU (read after the layer), ``cpu_clock`` stamps on a CPU.
    """
    copies = copies or len(decoder.layers)
    state = decoder.prepare(batch, copies)
    x = randn((batch.tokens, decoder.model.hidden_size), decoder.dtype, device, 1.0)
    for i in range(copies):  # first touch of every copy's outputs, untimed
        decoder.layer(i, x, batch, state)
    turn = itertools.count()
    cuda = device.type == "cuda"
    clock, cost = (time.perf_counter, 0.0) if cuda else cpu_clock()

    def sample() -> Sample:
        i = next(turn) % copies
        marks: list[tuple[str, Any]] = []
        parts: Sample = {}
        if cuda:

            def mark(part: str) -> None:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                marks.append((part, event))

            # the copy before, untimed, keeps the GPU busy while this layer's kernels are
            # launched, as the layer before does in a forward pass (else the first op's time
            # would include the idle GPU waiting for its launch)
            decoder.layer((i - 1) % copies, x, batch, state)
            prev = torch.cuda.Event(enable_timing=True)
            prev.record()
            decoder.layer(i, x, batch, state, mark)
            marks[-1][1].synchronize()
            for part, event in marks:
                parts[part] = parts.get(part, 0.0) + prev.elapsed_time(event) / 1000.0
                prev = event
            return parts

        def stamp(part: str) -> None:
            marks.append((part, clock()))

        last = clock()
        decoder.layer(i, x, batch, state, stamp)
        for part, now in marks:
            parts[part] = parts.get(part, 0.0) + max(now - last - cost, 1e-9)
            last = now
        return parts

    return sample


def summarize(samples: list[float]) -> Timing:
    """Median and (q3 - q1) / median of timed samples."""
    median = statistics.median(samples)
    if len(samples) >= 4:
        q = statistics.quantiles(samples, n=4)
        spread = (q[2] - q[0]) / median
    else:
        spread = (max(samples) - min(samples)) / median
    return Timing(median, max(spread, 0.0))


# -- kernel families: each returns the pieces of one point ---------------------------------------
def gemm_pieces(shape: GemmShape, rows: int, weight: torch.Tensor, bias, dtype, device):
    """``rows x k`` activations times the shared ``n x k`` weight (with bias where the model
    has one); the weight is shared by every row count of the shape."""
    x = randn((rows, shape.k), dtype, device, 1.0)
    return [(lambda: F.linear(x, weight, bias), (x,))]


def elementwise_probe_pieces(
    weights: LayerWeights, shape: AttnShape, hidden: int, tokens: int, dtype, device
) -> list[Piece]:
    """Norms, RoPE, residual adds and SiLU of one layer at ``tokens`` tokens, each piece timed
    in its own cache state (in the forward each follows a GEMM or attention)."""
    x = randn((tokens, hidden), dtype, device, 1.0)
    y = randn((tokens, hidden), dtype, device, 1.0)
    qkv = randn((tokens, weights.qkv.shape[0]), dtype, device, 1.0)
    gate_up = randn((tokens, weights.gate_up.shape[0]), dtype, device, 1.0)
    rotated = shape.rope if shape.kind == "mla" else shape.head_dim
    cos, sin = rope_tables(torch.arange(tokens, device=device), rotated)
    cos, sin = cos.to(dtype), sin.to(dtype)
    return elementwise_pieces(x, y, qkv, gate_up, weights, cos, sin, shape)


def prefill_pieces(shape: AttnShape, new: int, context: int, dtype, device) -> list[Piece]:
    """One layer's attention for a chunk of ``new`` tokens after ``context`` cached ones."""
    heads = shape.heads if shape.kind == "mla" else shape.kv_heads  # MLA prefill: MHA form
    q = randn((new, shape.heads, shape.head_dim), dtype, device, 1.0)
    k = randn((new, heads, shape.head_dim), dtype, device, 1.0)
    v = randn((new, heads, shape.v_dim), dtype, device, 1.0)
    kc = randn((1, heads, context + new, shape.head_dim), dtype, device, 1.0)
    vc = randn((1, heads, context + new, shape.v_dim), dtype, device, 1.0)
    return [(lambda: prefill_chunk(q, k, v, kc, vc, context), (q, k, v))]


def decode_pieces(shape: AttnShape, batch: int, context: int, dtype, device) -> list[Piece]:
    """One layer's attention for ``batch`` sequences each with ``context`` cached tokens."""
    if shape.kind == "mla":  # absorbed form over the shared latent (+ rope part)
        width = shape.latent + shape.rope
        ql = randn((batch, shape.heads, 1, width), dtype, device, 1.0)
        cache = randn((batch, 1, context + 1, width), dtype, device, 1.0)
        return [(lambda: mla_decode(ql, cache, shape.latent), (ql,))]
    q = randn((batch, shape.heads, shape.head_dim), dtype, device, 1.0)
    k = randn((batch, shape.kv_heads, shape.head_dim), dtype, device, 1.0)
    v = randn((batch, shape.kv_heads, shape.v_dim), dtype, device, 1.0)
    kc = randn((batch, shape.kv_heads, context + 1, shape.head_dim), dtype, device, 1.0)
    vc = randn((batch, shape.kv_heads, context + 1, shape.v_dim), dtype, device, 1.0)
    return [(lambda: decode_batch(q, k, v, kc, vc, context), (q, k, v))]


def time_copy(timer: Timer, nbytes: int, direction: str, device: torch.device) -> Timing:
    """Host-to-device or device-to-host copy of ``nbytes`` with pinned host memory (on a CPU
    run: a plain memory copy, the closest thing a CPU has to a host link)."""
    cuda = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src, dst = (host, dev) if direction == "h2d" else (dev, host)
    return timer(lambda: dst.copy_(src, non_blocking=cuda))


# -- storage --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StorageResult:
    """Sequential-read timings into device memory and how they got there."""

    path: str  # "gds" (kvikio/cuFile), "bounce" (file -> pinned host -> device), "host" (CPU run)
    method: str  # "o_direct" or "buffered" (O_DIRECT refused by the file system)
    directory: str
    sizes: list[int]
    timings: list[Timing]


def _open_direct(path: Path) -> tuple[int, str]:
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            return os.open(path, os.O_RDONLY | flag), "o_direct"
        except OSError:
            pass
    return os.open(path, os.O_RDONLY), "buffered"


def time_storage(
    sizes: list[int], file_bytes: int, directory: str | None, device: torch.device, reps: int
) -> StorageResult:
    """Large sequential reads of a fresh file, bypassing the page cache where the file system
    allows O_DIRECT; on CUDA through kvikio (GPUDirect Storage) when it imports, else bounced."""
    folder = tempfile.mkdtemp(prefix="kvsim-calibrate-", dir=directory)
    path = Path(folder) / "read.bin"
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for _ in range(file_bytes >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    try:
        if device.type == "cuda":
            try:
                import kvikio  # type: ignore[import-not-found]

                return _time_gds(kvikio, path, sizes, device, reps, folder)
            except ImportError:
                pass
        fd, method = _open_direct(path)
        try:
            buf = mmap.mmap(-1, max(sizes))  # page-aligned, as O_DIRECT needs
            cuda = device.type == "cuda"
            pinned = torch.empty(max(sizes), dtype=torch.uint8, pin_memory=True) if cuda else None
            dev = torch.empty(max(sizes), dtype=torch.uint8, device=device) if cuda else None
            timings = []
            for size in sizes:
                samples = []
                for rep in range(reps + 1):
                    offset = (rep * size) % max(file_bytes - size + 1, 1)
                    offset -= offset % 4096
                    if method == "buffered" and hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    start = time.perf_counter()
                    got = os.preadv(fd, [memoryview(buf)[:size]], offset)
                    if cuda:
                        pinned[:got].numpy()[:] = memoryview(buf)[:got]  # type: ignore[index]
                        dev[:got].copy_(pinned[:got], non_blocking=True)  # type: ignore[index]
                        torch.cuda.synchronize(device)
                    if rep:  # the first read warms up
                        samples.append(time.perf_counter() - start)
                timings.append(summarize(samples))
            path_kind = "bounce" if cuda else "host"
            return StorageResult(path_kind, method, folder, sizes, timings)
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
        os.rmdir(folder)


def _time_gds(kvikio: Any, path: Path, sizes, device, reps, folder) -> StorageResult:
    dev = torch.empty(max(sizes), dtype=torch.uint8, device=device)
    timings = []
    with kvikio.CuFile(str(path), "r") as f:
        for size in sizes:
            samples = []
            for rep in range(reps + 1):
                start = time.perf_counter()
                f.read(dev[:size])
                torch.cuda.synchronize(device)
                if rep:
                    samples.append(time.perf_counter() - start)
            timings.append(summarize(samples))
    return StorageResult("gds", "o_direct", folder, sizes, timings)

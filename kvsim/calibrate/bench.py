"""Microbenchmarks: time each kernel family at a sweep of sizes, median and spread.

Each measurement warms up, then times several repetitions; a repetition runs the kernel enough
times back to back to last about a millisecond, so timer resolution and Python dispatch jitter
stay small. GPU repetitions are timed with CUDA events, CPU ones with ``perf_counter``. The
spread is the interquartile range over the median.
"""

from __future__ import annotations

import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kvsim.calibrate.ops import (
    AttnShape,
    LayerWeights,
    decode_batch,
    elementwise,
    mla_decode,
    prefill_chunk,
    randn,
    rope_tables,
)
from kvsim.hardware.measured import GemmShape


@dataclass(frozen=True)
class Timing:
    """Median seconds of one call and the relative interquartile spread."""

    seconds: float
    spread: float


class Timer:
    """Times a callable on one device: warm-up, then ``reps`` timed repetitions."""

    def __init__(self, device: torch.device, warmup: int, reps: int, target_s: float) -> None:
        self.device, self.warmup, self.reps, self.target_s = device, warmup, reps, target_s
        self.cuda = device.type == "cuda"

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], Any]) -> Timing:
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
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - start) / inner)
        return summarize(samples)


def summarize(samples: list[float]) -> Timing:
    """Median and (q3 - q1) / median of timed samples."""
    median = statistics.median(samples)
    if len(samples) >= 4:
        q = statistics.quantiles(samples, n=4)
        spread = (q[2] - q[0]) / median
    else:
        spread = (max(samples) - min(samples)) / median
    return Timing(median, max(spread, 0.0))


# -- kernel families --------------------------------------------------------------------------
def time_gemm(timer: Timer, shape: GemmShape, rows: int, dtype, device) -> Timing:
    """``rows x k`` activations times the ``n x k`` weight (with bias where the model has one)."""
    x = randn((rows, shape.k), dtype, device, 1.0)
    w = randn((shape.n, shape.k), dtype, device)
    b = randn((shape.n,), dtype, device) if shape.bias else None
    return timer(lambda: F.linear(x, w, b))


def time_elementwise(
    timer: Timer, weights: LayerWeights, shape: AttnShape, hidden: int, tokens: int, dtype, device
) -> Timing:
    """Norms, RoPE, residual adds and SiLU of one layer at ``tokens`` tokens."""
    x = randn((tokens, hidden), dtype, device, 1.0)
    y = randn((tokens, hidden), dtype, device, 1.0)
    qkv = randn((tokens, weights.qkv.shape[0]), dtype, device, 1.0)
    gate_up = randn((tokens, weights.gate_up.shape[0]), dtype, device, 1.0)
    cos, sin = rope_tables(torch.arange(tokens, device=device), shape.head_dim)
    cos, sin = cos.to(dtype), sin.to(dtype)
    return timer(lambda: elementwise(x, y, qkv, gate_up, weights, cos, sin, shape))


def time_prefill(timer: Timer, shape: AttnShape, new: int, context: int, dtype, device) -> Timing:
    """One layer's attention for a chunk of ``new`` tokens after ``context`` cached ones."""
    if shape.kind == "mla":  # prefill decompresses the latent into full heads (MHA form)
        q = randn((new, shape.heads, shape.head_dim), dtype, device, 1.0)
        k = randn((new, shape.heads, shape.head_dim), dtype, device, 1.0)
        v = randn((new, shape.heads, shape.v_dim), dtype, device, 1.0)
        kc = randn((1, shape.heads, context + new, shape.head_dim), dtype, device, 1.0)
        vc = randn((1, shape.heads, context + new, shape.v_dim), dtype, device, 1.0)
    else:
        q = randn((new, shape.heads, shape.head_dim), dtype, device, 1.0)
        k = randn((new, shape.kv_heads, shape.head_dim), dtype, device, 1.0)
        v = randn((new, shape.kv_heads, shape.v_dim), dtype, device, 1.0)
        kc = randn((1, shape.kv_heads, context + new, shape.head_dim), dtype, device, 1.0)
        vc = randn((1, shape.kv_heads, context + new, shape.v_dim), dtype, device, 1.0)
    return timer(lambda: prefill_chunk(q, k, v, kc, vc, context))


def time_decode(timer: Timer, shape: AttnShape, batch: int, context: int, dtype, device) -> Timing:
    """One layer's attention for ``batch`` sequences each with ``context`` cached tokens."""
    if shape.kind == "mla":  # absorbed form over the shared latent (+ rope part)
        width = shape.latent + shape.rope
        q = randn((batch, shape.heads, 1, width), dtype, device, 1.0)
        cache = randn((batch, 1, context + 1, width), dtype, device, 1.0)
        return timer(lambda: mla_decode(q, cache, shape.latent))
    q = randn((batch, shape.heads, shape.head_dim), dtype, device, 1.0)
    k = randn((batch, shape.kv_heads, shape.head_dim), dtype, device, 1.0)
    v = randn((batch, shape.kv_heads, shape.v_dim), dtype, device, 1.0)
    kc = randn((batch, shape.kv_heads, context + 1, shape.head_dim), dtype, device, 1.0)
    vc = randn((batch, shape.kv_heads, context + 1, shape.v_dim), dtype, device, 1.0)
    return timer(lambda: decode_batch(q, k, v, kc, vc, context))


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

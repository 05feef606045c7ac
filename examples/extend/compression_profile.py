"""Adding a KV compression profile: one class, registered, then run like any built-in.

The profile here, `window`, is plain window attention: each KV head keeps only the most recent
`window` tokens (the baseline StreamingLLM, arXiv 2309.17453, compares against; it has no
attention sinks), optionally stored at `bits` bits per element with an fp16 scale and zero-point
per group of 32, as KIVI stores them. It is made up for the example, not a kvsim profile.

A profile is a `Compression` subclass. Its class attributes declare its name, its keys (each
with a default and where the default comes from) and its kind: `drops_tokens` (fewer tokens than
the context stay in memory), `prompt_only`, `offloaded`. Its methods answer what callers ask,
so nothing in kvsim tests a profile's name:

- `keep(tokens, layer)`: how many tokens of the context one KV head keeps (`kept_tokens` caps
  it at the context; `read_tokens`, what a decode step reads, defaults to the kept tokens);
- `layer_bits(layer)`: (K bits, V bits, group) a layer stores, or None for the base KV dtype;
  sizing prices the packed widths, the quantising pass and the dequantising reads from it;
- `add_layer_work(add, layer, ...)`: any work of its own (scoring, top-k), per layer;
- `exact_tokens`: leading tokens that stay at their positions, so their pages stay reusable;
- `unpublished` (or `quality_budget` / `quality_keys` to match published points): its quality.

Then kvsim does the rest: `parse_compression("window:window=256,bits=4")`, exact bytes per
sequence, pages in the engine, compaction after prefill, decode reads and the summary's memory
figures. Inside kvsim the class goes in a file of its own under kvsim/compression/profiles/ and
one line in that package's `__init__` registers it. A package outside kvsim declares it in its
pyproject.toml instead, and then the command line finds it too:

    [project.entry-points."kvsim.compression"]
    window = "my_package.window:Window"

Run: python examples/extend/compression_profile.py
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from kvsim.compression import (
    Compression,
    Key,
    bytes_per_kept_token,
    compressed_kv_bytes,
    parse_compression,
    quality_reason,
    register,
)
from kvsim.engine import EngineConfig
from kvsim.models import load_model
from kvsim.run import RunConfig, run


class Window(Compression):
    name = "window"
    summary = "window attention: the most recent tokens only, optionally quantised"
    source = "the window-attention baseline of StreamingLLM, arXiv 2309.17453"
    keys: ClassVar[Mapping[str, Key]] = {
        "window": Key("int", 1024, "Recent tokens kept per KV head (StreamingLLM's 1024 cache)."),
        "bits": Key("bits", 16, "K and V bits per element (16: the base KV dtype)."),
    }
    drops_tokens = True  # the window slides over the whole context, as streaming's does
    unpublished = "window attention is a baseline of StreamingLLM, reported as perplexity only"

    def keep(self, tokens: int, layer: int | None) -> int:
        return self.param("window")

    def layer_bits(self, layer: int | None = None) -> tuple[int, int, int] | None:
        bits = self.param("bits")
        return None if bits >= 16 else (bits, bits, 32)


register(Window)


def main() -> None:
    llama = load_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128 dims, bf16
    window = parse_compression("window:window=256,bits=4")
    print("parsed:", window.label, "| kept of 5,000 tokens:", window.kept_tokens(5_000))
    print("bytes per kept token:", f"{bytes_per_kept_token(llama, window):,.0f}")
    for n in (100, 32_768):
        plain = compressed_kv_bytes(llama, parse_compression("none"), n)
        print(f"KV at {n:,} tokens: {compressed_kv_bytes(llama, window, n):,} B "
              f"(uncompressed {plain:,} B)")  # fmt: skip
    print("quality:", quality_reason(window))
    print(f"{'profile':<26} requests  completed  KV MiB per request")
    for text in ("none", "window:window=256", "window:window=256,bits=4"):
        engine = EngineConfig(compression=text)
        outcome = run(RunConfig(trace="sharegpt", max_requests=40, engine=engine))
        statuses = outcome.result.requests.column("status").to_pylist()
        mib = outcome.summary["kv_bytes_per_request_mean"] / 2**20
        print(f"{text:<26} {len(statuses):>8}  {statuses.count('completed'):>9}  {mib:>19.2f}")


if __name__ == "__main__":
    main()

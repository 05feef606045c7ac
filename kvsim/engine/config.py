"""Settings of one serving replica, with vLLM's defaults where vLLM has one."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from kvsim.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What a user of vLLM would set on the command line, plus the simulator's seed."""

    block_size: int = field(default=16, metadata={"help": "tokens per KV block (vLLM default 16)"})
    max_num_seqs: int = field(
        default=256, metadata={"help": "sequences per iteration (vLLM default 256)"}
    )
    max_num_batched_tokens: int = field(
        default=8192,
        metadata={
            "help": "tokens per iteration, the chunked-prefill budget (vLLM V1 default 8192)"
        },
    )
    tp: int = field(default=1, metadata={"help": "tensor-parallel GPUs in the replica"})
    kv_dtype: str = field(default="bf16", metadata={"help": "KV cache dtype"})
    weight_dtype: str = field(default="bf16", metadata={"help": "weight dtype"})
    policy: str = field(default="lru", metadata={"help": "HBM eviction policy"})
    enable_prefix_caching: bool = field(
        default=True, metadata={"help": "reuse cached prefix blocks (vLLM APC)"}
    )
    num_gpu_blocks: int | None = field(
        default=None, metadata={"help": "override the KV blocks derived from HBM capacity"}
    )
    coalesce_decode: bool = field(
        default=True, metadata={"help": "run unchanged decode batches as one event"}
    )
    seed: int = field(default=0, metadata={"help": "the one seed all randomness flows from"})

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine.{name}: expected a positive integer, got {value!r}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"engine.num_gpu_blocks: expected >= 1, got {self.num_gpu_blocks}")

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

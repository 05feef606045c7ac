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
    policy: str = field(
        default="lru", metadata={"help": "eviction policy, or one per tier: 'hbm=lru,dram=arc'"}
    )
    policy_params: str = field(
        default="",
        metadata={"help": "policy parameters, e.g. 'bayes-reuse.horizon_s=60,ema-head.groups=4'"},
    )
    enable_prefix_caching: bool = field(
        default=True, metadata={"help": "reuse cached prefix blocks (vLLM APC)"}
    )
    num_gpu_blocks: int | None = field(
        default=None, metadata={"help": "override the KV blocks derived from HBM capacity"}
    )
    coalesce_decode: bool = field(
        default=True, metadata={"help": "run unchanged decode batches as one event"}
    )
    tiers: str | None = field(
        default=None,
        metadata={"help": "tiers to use, e.g. 'hbm,dram,nvme' or 'all' (default: the profile's)"},
    )
    tier_capacity: str = field(
        default="", metadata={"help": "capacity overrides per node, e.g. 'dram=1TiB,nvme=8TB'"}
    )
    write_policy: str = field(
        default="write-back",
        metadata={"help": "write-back (write a block down when HBM evicts it) or write-through"},
    )
    hierarchy: str = field(
        default="inclusive",
        metadata={"help": "inclusive (a loaded block keeps its copy below) or exclusive"},
    )
    admission: str = field(
        default="all",
        metadata={"help": "lower-tier admission: all or second-chance, or per tier 'nvme=...'"},
    )
    prefetch: bool = field(
        default=True,
        metadata={"help": "load a session's blocks towards HBM while it thinks or waits on a tool"},
    )
    prefetch_lead_s: float = field(
        default=0.5,
        metadata={"help": "start a prefetch this long before the next turn is due (assumption)"},
    )
    rope_reuse: bool = field(
        default=False,
        metadata={
            "help": "reuse a document or tool segment's KV at a new position by re-rotating "
            "its keys, instead of recomputing it"
        },
    )
    timeline_interval_s: float = field(
        default=1.0, metadata={"help": "simulated seconds between timeline samples"}
    )
    seed: int = field(default=0, metadata={"help": "the one seed all randomness flows from"})

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine.{name}: expected a positive integer, got {value!r}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"engine.num_gpu_blocks: expected >= 1, got {self.num_gpu_blocks}")
        choices = {
            "write_policy": ("write-back", "write-through"),
            "hierarchy": ("inclusive", "exclusive"),
        }
        for name, valid in choices.items():
            value = getattr(self, name)
            if value not in valid:
                raise ConfigError(
                    f"engine.{name}: expected one of {', '.join(valid)}, got {value!r}"
                )
        if self.write_policy == "write-through" and self.hierarchy == "exclusive":
            raise ConfigError(
                "engine.write_policy: write-through keeps a copy below every HBM block, "
                "so it needs hierarchy = 'inclusive'"
            )
        for name in ("prefetch_lead_s", "timeline_interval_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value >= 0:
                raise ConfigError(f"engine.{name}: expected a non-negative number, got {value!r}")
        if self.timeline_interval_s <= 0:
            raise ConfigError("engine.timeline_interval_s: expected a positive number of seconds")

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

"""Settings of one serving replica, as a user of a serving engine would give them.

Values are kept as the user typed them; `kvsim.engine.resolve` parses and checks them, and fills
the scheduler settings left unset (None) from the engine profile (kvsim.engines).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What a user of vLLM would set on the command line, plus the simulator's seed."""

    block_size: int = field(default=16, metadata={"help": "tokens per KV block (vLLM default 16)"})
    engine: str = field(
        default="vllm",
        metadata={
            "help": "serving engine profile NAME[@VERSION] (kvsim.engines: vllm, sglang, trtllm, "
            "and older versions such as vllm@0.6) or a .toml file: CUDA graphs, scheduling "
            "overhead and overlap, front end, all-reduce, and the defaults of the five "
            "settings below"
        },
    )
    max_num_seqs: int | None = field(
        default=None, metadata={"help": "sequences per iteration (default: the engine's)"}
    )
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata={
            "help": "tokens per iteration, the chunked-prefill budget (default: the engine's)"
        },
    )
    chunked_prefill: bool | None = field(
        default=None,
        metadata={
            "help": "split a prompt across iterations to fill the token budget (vLLM V1, "
            "SGLang); off: a prompt starts only when it fits whole beside the running batch "
            "(TensorRT-LLM's default, vLLM V0 without --enable-chunked-prefill); default: the "
            "engine's"
        },
    )
    num_scheduler_steps: int | None = field(
        default=None,
        metadata={
            "help": "decode steps per scheduler call (vLLM v0 multi-step, --num-scheduler-steps): "
            "a waiting request is admitted only between rounds (default: the engine's)"
        },
    )
    kv_reservation: str | None = field(
        default=None,
        metadata={
            "help": "free KV a request needs to be admitted: prompt (vLLM, SGLang: preempt later "
            "if outputs outgrow memory) or full (TensorRT-LLM's GUARANTEED_NO_EVICT: prompt plus "
            "the whole output, never preempted); default: the engine's"
        },
    )
    mixed_batches: bool | None = field(
        default=None,
        metadata={
            "help": "prefill chunks and decodes share an iteration (vLLM, TensorRT-LLM); off: "
            "an iteration is all prefill or all decode, prefill first (SGLang without "
            "--enable-mixed-chunk); default: the engine's"
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
    load_overlap: str = field(
        default="none",
        metadata={
            "help": "how a load from a lower tier overlaps compute: none (load, then prefill, as "
            "vLLM's offloading connector), layerwise (CachedAttention: layer l computes once its "
            "KV is in) or bidirectional (Cake: compute the cached prefix from the front while "
            "loading it from the back)"
        },
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
    compression: str = field(
        default="none",
        metadata={
            "help": "KV compression profile NAME[:k=v,...] (kvsim.compression: none, quant, "
            "streaming, h2o, snapkv, lkv, kvp, moe-nd, infinigen) or auto (per request)"
        },
    )
    auto_latency_budget_s: float = field(
        default=0.05,
        metadata={
            "help": "auto: the decode step a request's choice may cost, in seconds "
            "(our assumption: a 50 ms TPOT objective)"
        },
    )
    auto_memory_fraction: float = field(
        default=0.05,
        metadata={
            "help": "auto: the share of a replica's KV memory one request may hold "
            "(our assumption: 1/20, room for about 20 long requests)"
        },
    )
    seed: int = field(default=0, metadata={"help": "the one seed all randomness flows from"})
    replicas: int | None = field(
        default=None,
        metadata={"help": "serving replicas of tp GPUs each (default 1; with pd: P + D)"},
    )
    router: str = field(
        default="round-robin", metadata={"help": "router name (kvsim.routers) or module:Class"}
    )
    router_params: str = field(
        default="", metadata={"help": "router parameters, e.g. 'dynamo-kv.overlap_score_weight=2'"}
    )
    router_refresh_s: float = field(
        default=0.0,
        metadata={"help": "seconds between the snapshots routers see (0: exact, live state)"},
    )
    pd: str = field(
        default="",
        metadata={"help": "prefill/decode disaggregation 'P:D' (P prefill, D decode replicas)"},
    )
    pd_threshold: int | None = field(
        default=None,
        metadata={
            "help": "prefill on the decode replica when its uncached tokens are fewer than this "
            "(default: the router's rule, else always disaggregate)"
        },
    )

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

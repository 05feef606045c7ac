"""Adding a hardware profile: one TOML file, validated, then run by its path.

The node here, `x1-node`, is made up for the example: four "X1" GPUs of 64 GB at 2 TB/s, a PCIe
Gen4 host link and 512 GB of DRAM. Nothing in it is a real product; every number is an
assumption and its `[sources]` entry says so and why, as a shipped profile cites its datasheet
(hardware_profiles/README.md gives the format and where the shipped numbers come from).

Validation refuses a file it cannot trust, in one line naming the file and the field: a number
without a `[sources]` entry, a size or bandwidth without its unit, a figure out of a plausible
range (989.4 for 989.4e12 FLOP/s), tiers out of order, an HBM tier that is not `gpus_per_node x
gpu.hbm`. `validate_profile(path)` checks a file and returns the `HardwareProfile`;
`load_profile` and every run, sweep and plan take a name or a path ending in `.toml` and
validate it the same way, so the command line takes the file too:

    kvsim profile validate x1-node.toml
    kvsim run --hardware x1-node.toml --trace sharegpt

To use it by name, put it beside the shipped ones in hardware_profiles/ (named by its file
stem), or point `KVSIM_PROFILES` at a folder of your own (which then replaces the shipped one).

Run: python examples/extend/hardware_profile.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.hardware import validate_profile
from kvsim.run import RunConfig, run

X1_NODE = """\
name = "x1-node"
description = "made-up node for kvsim's example: 4x X1 64GB, PCIe Gen4 host links, 512 GB DRAM"
gpus_per_node = 4
gpu_usd_per_hour = 3.0
gpu_memory_utilization = 0.9

[gpu]
name = "X1"
hbm = "64GB"
hbm_bandwidth = "2TB/s"
interconnect_bandwidth = "300GB/s"  # per direction
host_link_bandwidth = "32GB/s"      # per direction

[gpu.flops]
bf16 = 500e12
fp8 = 1000e12

[efficiency]
compute = 0.7
memory = 0.85

[[tiers]]
name = "hbm"
capacity = "256GB"
read_bandwidth = "2TB/s"
write_bandwidth = "2TB/s"
bandwidth_scope = "per_gpu"
latency = "1us"
usd_per_gb_hour = 0.0
enabled = true

[[tiers]]
name = "dram"
capacity = "512GB"
read_bandwidth = "25GB/s"
write_bandwidth = "25GB/s"
bandwidth_scope = "per_gpu"
latency = "5us"
transfer_overhead = "3.5us"
usd_per_gb_hour = 0.00053
enabled = true

[sources]
"gpus_per_node" = "assumption: made up; four GPUs, half a DGX"
"gpu_usd_per_hour" = "assumption: made up; half an H100's hour for about half its speed"
"gpu_memory_utilization" = "assumption: vLLM's default, as the shipped profiles take"
"gpu.hbm" = "assumption: made up; 64 GB of HBM per GPU"
"gpu.hbm_bandwidth" = "assumption: made up; 2 TB/s, between an A100's and an H100's"
"gpu.interconnect_bandwidth" = "assumption: made up; 600 GB/s bidirectional, halved"
"gpu.host_link_bandwidth" = "assumption: PCIe Gen4 x16, 64 GB/s bidirectional, halved"
"gpu.flops.bf16" = "assumption: made up; 500 TFLOP/s dense BF16"
"gpu.flops.fp8" = "assumption: made up; twice BF16, as FP8 tensor cores give"
"efficiency.compute" = "assumption: 70 % of peak in GEMMs, below the H100's fitted 0.76"
"efficiency.memory" = "assumption: 85 % of peak HBM bandwidth, near the shipped 0.9"
"tiers.hbm.capacity" = "assumption: 4 GPUs x 64 GB"
"tiers.hbm.read_bandwidth" = "assumption: the GPU's HBM bandwidth"
"tiers.hbm.write_bandwidth" = "assumption: the GPU's HBM bandwidth"
"tiers.hbm.latency" = "assumption: ~1 us to launch a block copy, as the shipped take"
"tiers.hbm.usd_per_gb_hour" = "assumption: HBM is paid for in gpu_usd_per_hour"
"tiers.dram.capacity" = "assumption: made up; 512 GB of DRAM per node"
"tiers.dram.read_bandwidth" = "assumption: ~80 % of the 32 GB/s Gen4 link, as DMA reaches"
"tiers.dram.write_bandwidth" = "assumption: same as read"
"tiers.dram.latency" = "assumption: ~5 us to set up a PCIe DMA, as the shipped take"
"tiers.dram.transfer_overhead" = "assumption: 3.5 us per DMA copy, as h100-sxm measured"
"tiers.dram.usd_per_gb_hour" = "assumption: DDR5 at $14/GB over 3 years, as the shipped take"
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x1-node.toml"
        path.write_text(X1_NODE)
        profile = validate_profile(path)
        gpu = profile.gpu
        print(f"{profile.name}: {profile.gpus_per_node}x {gpu.name}, "
              f"{gpu.hbm_bytes / 1e9:g} GB at {gpu.hbm_bandwidth_bytes_per_s / 1e12:g} TB/s, "
              f"tiers {[t.name for t in profile.enabled_tiers]}, "
              f"{len(profile.sources)} numbers, each with its source")  # fmt: skip
        # The same file with one number's source left out is refused, in one line:
        unsourced = path.with_name("unsourced.toml")
        unsourced.write_text(X1_NODE.replace('"gpu.hbm" =', '# "gpu.hbm" ='))
        try:
            validate_profile(unsourced)
        except ConfigError as exc:
            message = str(exc)  # starts with the file's path
            print("refused:", message[message.index(unsourced.name) :])
        print("sharegpt, 50 requests, llama-3.1-8b: TPOT p50")
        for hardware in (str(path), "h100-sxm"):
            summary = run(RunConfig(trace="sharegpt", max_requests=50, hardware=hardware)).summary
            print(f"  {summary['hardware']:<9} {summary['tpot_p50_s'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

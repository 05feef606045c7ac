"""Write the hand-made AIConfigurator fixture beside this file (python make_fixture.py).

A few rows in the wheel's layout and column names (latency in milliseconds, all-reduce sizes in
elements), chosen so tests/test_aiconfigurator_import.py can work each imported value out by
hand for llama-3.1-8b at TP 2 on h100_sxm under vLLM: per GPU, heads 16, KV heads 4, head dim
128; GEMMs qkv n 3072 x k 4096, o 4096 x 2048, gate_up 14336 x 4096, down 4096 x 7168, LM head
64128 x 4096. The numbers are made up, not NVIDIA's.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
SYSTEMS = "aiconfigurator_core/systems/data/h100_sxm"
DEVICE = "NVIDIA H100 80GB HBM3"
#: per-weight-element seconds of each measured (n, k) GEMM shape at m = 1, 16, 256
GEMM_SHAPES = {
    (3072, 4096): 1e-12,  # qkv, exact
    (4096, 2048): 2e-12,  # o, exact
    (12288, 4096): 1e-12,  # gate_up lies between these two
    (16384, 4096): 2e-12,
    (4096, 4096): 3e-12,  # down lies between these two
    (4096, 8192): 1e-12,
}
M_FACTOR = {1: 1.0, 16: 1.5, 256: 4.0}


def gemm() -> pd.DataFrame:
    rows = []
    for (n, k), per_element in GEMM_SHAPES.items():
        for m, f in M_FACTOR.items():
            rows.append(
                ("bfloat16", "torch.nn.functional.linear", m, n, k, n * k * per_element * f)
            )
    rows.append(("fp8", "CutlassFP8ScaledMMLinearKernel", 1, 3072, 4096, 0.5e-9))  # other dtype
    frame = pd.DataFrame(rows, columns=["gemm_dtype", "kernel_source", "m", "n", "k", "s"])
    frame["latency"] = frame.pop("s") * 1e3
    return _stamp(frame, "gemm")


def attention(kind: str) -> pd.DataFrame:
    cols = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"]
    rows = []
    if kind == "context":
        for isl, ms in ((16, 0.010), (256, 0.020), (1024, 0.080)):
            rows.append((1, isl, 16, 4, 128, "bfloat16", 0, 0, ms))
        rows.append((2, 256, 16, 4, 128, "bfloat16", 0, 0, 0.5))  # batch 2: not a prompt curve
        rows.append((1, 256, 16, 4, 128, "fp8", 0, 0, 0.5))  # other KV dtype
        rows.append((1, 256, 32, 8, 128, "bfloat16", 0, 0, 0.5))  # the TP-1 shape
        rows.append((1, 256, 16, 4, 128, "bfloat16", 0, 128, 0.5))  # a sliding window
    else:
        for batch, step, ms in (
            (1, 15, 0.010),
            (1, 255, 0.012),
            (1, 1023, 0.020),
            (4, 15, 0.011),
            (4, 255, 0.030),
            # (4, 1023) is not measured, as the database skips its largest batch x context
        ):
            rows.append((batch, 1, 16, 4, 128, "bfloat16", step, 0, ms))
        rows.append((4, 1, 16, 4, 128, "fp8", 255, 0, 0.5))  # other KV dtype
    frame = pd.DataFrame(rows, columns=[*cols, "step", "window_size", "latency"])
    frame.insert(0, "kernel_source", "vllm_flash_attn_fa3")
    frame["beam_width"] = 1
    frame["attn_dtype"] = "bfloat16"
    return _stamp(frame, f"{kind}_attention")


def custom_allreduce() -> pd.DataFrame:
    rows = []
    for elements, graph_ms, eager_ms in ((1024, 0.004, 0.020), (4 * 2**20, 0.030, 0.050)):
        rows.append(("vLLM_custom_graph", "vllm_graph", elements, graph_ms))
        rows.append(("vLLM_custom_eager", "vllm_eager", elements, eager_ms))
    rows.append(("vLLM_custom_graph", "vllm_graph", 8 * 2**20, 0.070))  # 16 MiB: above the limit
    frame = pd.DataFrame(rows, columns=["kernel_source", "backend", "message_size", "latency"])
    frame["allreduce_dtype"] = "bfloat16"
    frame["num_gpus"] = 2
    return _stamp(frame, "all_reduce", framework="vLLM")


def nccl() -> pd.DataFrame:
    rows = [
        ("all_reduce", "half", 2, 1024, 0.010),
        ("all_reduce", "half", 2, 4 * 2**20, 0.040),
        ("all_reduce", "half", 2, 8 * 2**20, 0.060),
        ("all_reduce", "half", 4, 1024, 0.015),  # other GPU count
        ("all_reduce", "int8", 2, 1024, 0.009),  # other dtype
        ("all_gather", "half", 2, 1024, 0.008),  # not an all-reduce
    ]
    frame = pd.DataFrame(
        rows, columns=["op_name", "nccl_dtype", "num_gpus", "message_size", "latency"]
    )
    frame.insert(0, "kernel_source", "NCCL")
    return _stamp(frame, None, framework="TRTLLM", version="2.29.2")


def _stamp(
    frame: pd.DataFrame, op: str | None, framework: str = "VLLM", version: str = "0.24.0"
) -> pd.DataFrame:
    frame.insert(0, "device", DEVICE)
    frame.insert(0, "version", version)
    frame.insert(0, "framework", framework)
    if op is not None:
        frame.insert(3, "op_name", op)
    return frame


TABLES = {
    "gemm/vllm/0.24.0/gemm_perf.parquet": gemm,
    "attention/vllm/0.24.0/context_attention_perf.parquet": lambda: attention("context"),
    "attention/vllm/0.24.0/generation_attention_perf.parquet": lambda: attention("generation"),
    "comm/vllm/0.24.0/custom_allreduce_perf.parquet": custom_allreduce,
    "comm/nccl/2.29.2/nccl_perf.parquet": nccl,
}
METADATA = "Metadata-Version: 2.4\nName: aiconfigurator-core\nVersion: 0.12.0\n"


def build(root: Path = HERE) -> None:
    """The fixture under ``root``: an extracted wheel's layout with its METADATA."""
    for rel, make in TABLES.items():
        path = root / SYSTEMS / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        make().to_parquet(path, index=False)
    meta = root / "aiconfigurator_core-0.12.0.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(METADATA, encoding="utf-8")


if __name__ == "__main__":
    build()

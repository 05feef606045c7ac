"""Rebuild this folder's CSVs: subsets of Vidur's profiling data (see PROVENANCE.md).

    python tests/data/vidur/make_sample.py PATH/TO/vidur.git

reads each file by its git blob hash (the same content at any commit that holds it), keeps the
columns kvsim reads and the rows listed below, and writes them next to this script.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
BLOBS = {
    # data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv at 7d47513
    "mlp.csv": "6f53232adc5acdae0e06226720bcc948a466f954",
    # data/profiling/a100/attention.csv at e2d00e9 (a Llama-2-70B shape at tp 2)
    "attention.csv": "ee3dec76948e46c3f686a111198e9c5703908553",
    # data/profiling/network/a100_dgx/all_reduce.csv at 7d47513
    "all_reduce.csv": "730776436cbd9e3e40aae50768e2b64921dd0379",
    # data/profiling/a100/cpu_overheads.csv at 57720ca
    "cpu_overheads.csv": "bf106186f8b1d3d6f43d05829a89f0fc411d5a65",
}
MLP_OPS = (
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
    "input_layernorm",
    "attn_rope",
    "post_attention_layernorm",
    "mlp_act",
    "add",
)


def blob(repo: str, sha: str) -> pd.DataFrame:
    text = subprocess.run(
        ["git", "-C", repo, "cat-file", "blob", sha], check=True, capture_output=True
    ).stdout
    return pd.read_csv(io.BytesIO(text))


def main(repo: str) -> None:
    mlp = blob(repo, BLOBS["mlp.csv"])
    tokens = {1, 2, 4, 8} | set(range(32, 513, 32)) | set(range(768, 4097, 256))
    mlp = mlp[mlp.num_tokens.isin(tokens) & mlp.num_tensor_parallel_workers.isin([2, 4])]
    keep = [f"time_stats.{op}.median" for op in MLP_OPS]
    keep += ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
    mlp[[*keep, "num_tokens", "num_tensor_parallel_workers"]].to_csv(HERE / "mlp.csv", index=False)

    att = blob(repo, BLOBS["attention.csv"])
    pre, dec = att[att.is_prefill], att[~att.is_prefill]
    chunks = {64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096}
    fresh = pre[(pre.kv_cache_size == 0) & pre.prefill_chunk_size.isin(chunks)]
    cached = pre[
        pre.prefill_chunk_size.isin({64, 128, 256, 512, 1024, 2048})
        & pre.kv_cache_size.isin({32, 128, 512, 1024, 2048})
    ]
    grid = {1, 2, 4, 8, 16, 32, 64, 128}, {32, 64, 128, 256, 512, 1024, 2048, 4032}
    decode = dec[dec.batch_size.isin(grid[0]) & dec.kv_cache_size.isin(grid[1])]
    cols = ["n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "is_prefill"]
    cols += ["batch_size", "prefill_chunk_size", "kv_cache_size"]
    cols += ["time_stats.attn_prefill.median", "time_stats.attn_decode.median"]
    pd.concat([fresh, cached, decode])[cols].to_csv(HERE / "attention.csv", index=False)

    ar = blob(repo, BLOBS["all_reduce.csv"])
    node = ar[(ar.devices_per_node == ar.num_workers) & ar.num_workers.isin([2, 4])]
    node = node.sort_values(["num_workers", "size"])
    node = node.groupby("num_workers").nth(slice(None, None, 9))
    across = ar[(ar.devices_per_node == 1) & (ar.num_workers == 2)].head(5)  # read_allreduce drops
    cols = ["time_stats.all_reduce.median", "num_workers", "size", "devices_per_node", "collective"]
    pd.concat([node, across])[cols].to_csv(HERE / "all_reduce.csv", index=False)

    cpu = blob(repo, BLOBS["cpu_overheads.csv"])
    cpu = cpu[cpu.model_name == "meta-llama/Llama-2-70b-hf"]
    cols = ["schedule_median", "prepare_inputs_e2e_median", "sampler_e2e_median"]
    cols += ["process_model_outputs_median", "model_name", "batch_size", "tensor_parallel_degree"]
    cpu[cols].to_csv(HERE / "cpu_overheads.csv", index=False)


if __name__ == "__main__":
    main(sys.argv[1])

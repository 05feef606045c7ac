#!/usr/bin/env bash
# Rebuild the measured profiles shipped from Vidur's public profiling data (issue 11):
# hardware_profiles/measured/a100-80gb-vidur-llama-2-70b-tp2.toml, the one model/GPU/TP for which
# Vidur's repository holds mlp.csv, attention.csv and all_reduce.csv together (the newer
# per-model attention files were not available; see docs/calibration.md).
#   benchmarks/import_vidur_profiles.sh PATH/TO/vidur      (a clone of github.com/microsoft/vidur)
# Files are read by git blob hash, so any clone holding them gives the same bytes. Vidur: MIT
# licence, Copyright (c) Microsoft Corporation.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=${1:?usage: benchmarks/import_vidur_profiles.sh PATH/TO/vidur}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv at 7d47513
git -C "$repo" cat-file blob 6f53232adc5acdae0e06226720bcc948a466f954 >"$tmp/mlp.csv"
# data/profiling/a100/attention.csv at e2d00e9: n_embd 8192, 64 q heads, 8 kv heads, tp 2
git -C "$repo" cat-file blob ee3dec76948e46c3f686a111198e9c5703908553 >"$tmp/attention.csv"
# data/profiling/network/a100_dgx/all_reduce.csv at 7d47513
git -C "$repo" cat-file blob 730776436cbd9e3e40aae50768e2b64921dd0379 >"$tmp/all_reduce.csv"
python -m kvsim calibrate import-vidur "$tmp" --model llama-2-70b --tp 2 --profile a100-80gb \
  --commit 7d47513363ec447a741ac5e47241580b47724fbf \
  --note "mlp.csv is data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv and all_reduce.csv is data/profiling/network/a100_dgx/all_reduce.csv at 7d47513363ec447a741ac5e47241580b47724fbf; attention.csv is data/profiling/a100/attention.csv at e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a (Llama-2-70B shape, tp 2, FlashAttention, block 16)" \
  --out hardware_profiles/measured/a100-80gb-vidur-llama-2-70b-tp2.toml
python -m kvsim profile validate hardware_profiles/measured/a100-80gb-vidur-llama-2-70b-tp2.toml

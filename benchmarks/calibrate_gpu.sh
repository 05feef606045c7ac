#!/usr/bin/env bash
# One-command GPU calibration (issue 6): the quick sweep on the first CUDA device, meant to take
# under 5 minutes on an H200 (llama-3.1-8b: ~70 probes x 3 interleaved rounds of CUDA-event
# timings, 10 forward passes, copies and a 256 MiB storage test). Writes
# hardware_profiles/measured/NAME.toml, NAME.report.md and NAME.report/*.png, and prints the
# held-out and end-to-end errors.
#   benchmarks/calibrate_gpu.sh [MODEL] [NAME]     (defaults: llama-3.1-8b, h200-sxm)
# Needs: pip install -e '.[calibrate]' (a CUDA build of torch); kvikio is used when installed.
# KVSIM_STORAGE_DIR: a folder on the NVMe to read from (default: $TMPDIR or /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-llama-3.1-8b}
name=${2:-h200-sxm}
out="hardware_profiles/measured/$name.toml"
python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  "calibrate_gpu.sh: this torch build sees no CUDA device (install a CUDA build of torch)")'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
time python -m kvsim.calibrate --device cuda --model "$model" --quick \
  --storage-dir "${KVSIM_STORAGE_DIR:-${TMPDIR:-/tmp}}" --out "$out"
python -m kvsim profile validate "$out"  # the calibration validated it too; fail loudly here

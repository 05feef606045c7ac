#!/usr/bin/env bash
# One-command GPU calibration (issue 6): the quick sweep on the first CUDA device, under 5 minutes
# on an H200. Writes hardware_profiles/measured/NAME.toml, NAME.report.md and NAME.report/*.png.
#   benchmarks/calibrate_gpu.sh [MODEL] [NAME]     (defaults: llama-3.1-8b, h200-sxm)
# Needs: pip install -e '.[calibrate]' (a CUDA build of torch); kvikio is used when installed.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-llama-3.1-8b}
name=${2:-h200-sxm}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
time python -m kvsim.calibrate --device cuda --model "$model" --quick \
  --storage-dir "${KVSIM_STORAGE_DIR:-${TMPDIR:-/tmp}}" \
  --out "hardware_profiles/measured/$name.toml"
python -m kvsim profile validate "hardware_profiles/measured/$name.toml" 2>/dev/null || true

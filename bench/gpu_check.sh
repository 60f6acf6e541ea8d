#!/usr/bin/env bash
# One command for a GPU node (< 10 minutes): every CUDA test of the suite (-m cuda:
# bf16 + channels_last step, NCCL, FFCV to the GPU, detection, the Trainer and its RNG resume
# on the GPU), the fast-path tests (on a GPU machine the Trainer runs them on the GPU), then
# MoCo v2 R50 and MoCo v3 ViT-S throughput with MFU.
#   bench/gpu_check.sh          on a CUDA machine: a missing GPU fails (CI=true, see conftest.require)
#   bench/gpu_check.sh --dry    on CPU: the CUDA tests collected only, the fast path forced on
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
dry=""; [ "${1:-}" = "--dry" ] && dry="--dry"
$PY - <<'PYEOF'
import torch
print("torch", torch.__version__, "| cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PYEOF
if [ -z "$dry" ]; then
  CI=true timeout 420 $PY -m pytest -q -m cuda tests -p no:cacheprovider
  timeout 300 $PY -m pytest -q tests/test_fast_path.py -p no:cacheprovider
  timeout 300 $PY -m pipeline.bench.gpu
else
  timeout 120 $PY -m pytest -q -m cuda tests --collect-only -p no:cacheprovider  # imports and fixtures
  timeout 300 $PY -m pytest -q tests/test_fast_path.py -p no:cacheprovider
  timeout 300 $PY -m pipeline.bench.gpu --dry --fast-path on
fi

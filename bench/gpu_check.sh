#!/usr/bin/env bash
# One command for the day a GPU is lent (< 8 minutes): the CUDA unit tests, MoCo v2 R50 and
# MoCo v3 ViT-S throughput with MFU, FFCV loading to the GPU (in the tests).
#   bench/gpu_check.sh          on a CUDA machine
#   bench/gpu_check.sh --dry    the same steps on CPU with tiny sizes (CI-safe dry mode)
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
  timeout 300 $PY -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider
else
  # no GPU: the CUDA tests are collected and skipped; their imports and fixtures still run
  timeout 300 $PY -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider || [ $? -eq 5 ]
fi
timeout 300 $PY -m pipeline.bench.gpu $dry

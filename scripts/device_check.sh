#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU and PyTorch (CUDA build):
#   1. builds the CUDA KV kernels and compares them with the CPU ones (native.selftest_cuda),
#   2. runs the PyTorch draft on CUDA with a CUDA event after every expansion step,
#   3. runs edge–cloud exactness with the target on the GPU (all policies, greedy + sampling),
#   4. measures whether bf16/fp32 tree forwards are bitwise one-token steps on the GPU,
# and writes a short report to ${OUT:-.}/device_report.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-.}
PY=${PYTHON:-python3}
{
  echo "# RAPID device check — $(date -u +%FT%TZ)"
  echo '```'; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; echo '```'
} > "$OUTDIR/device_report.md"
$PY -m pip install -q --no-deps -e . 2>&1 | tail -1
$PY -m pip install -q msgpack websockets tqdm 2>&1 | tail -1
cmake -S . -B build/kvops -DCMAKE_BUILD_TYPE=Release > "$OUTDIR/cmake.log" 2>&1 && cmake --build build/kvops -j8 >> "$OUTDIR/cmake.log" 2>&1 \
  && echo "- CUDA kernels built (sm_87;sm_90)" >> "$OUTDIR/device_report.md" \
  || echo "- CMake build FAILED (see cmake.log)" >> "$OUTDIR/device_report.md"
PYTHONUNBUFFERED=1 $PY scripts/device_check.py >> "$OUTDIR/device_report.md" 2>"$OUTDIR/device_check.err"
rc=$?
cat "$OUTDIR/device_report.md"
exit $rc

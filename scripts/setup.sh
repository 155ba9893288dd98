#!/usr/bin/env bash
# Creates .venv in the repo root, installs RAPID with every CPU-side extra, builds the native
# KV kernels (C++ always, CUDA when nvcc exists). Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# torch is pinned (2.13.0, CPU build) in pyproject: an unpinned torch would pull a multi-GB CUDA build.
echo "[setup] installing rapid-spec[cloud,edge,export,bench,dev,ray] (first time: a few minutes)"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[cloud,edge,export,bench,dev,ray]" 2>&1 \
  | grep -v -E "^WARNING: Location|is ignored" || true
if command -v cmake >/dev/null 2>&1; then
  echo "[setup] building native KV kernels into build/kvops"
  cmake -S . -B build/kvops -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build/kvops -j2 >/dev/null
else
  echo "[setup] cmake not found: native KV kernels skipped (numpy fallback is used)"
fi

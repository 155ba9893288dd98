#!/usr/bin/env bash
# CI step (run by scripts/test.sh): install only `.[edge]` (no torch) into build/edge-venv, then
# run `rapid edge --help`, `rapid doctor`, one `rapid generate --engine onnx` and one request to
# `rapid edge --draft <export>` against a tiny cloud. The cloud, the tiny models and the ONNX
# export are made with the main .venv (which has torch); the edge's text must equal the
# target-alone text. Fails (never skips) when pip cannot install the edge extra.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
EV=${EDGE_VENV:-build/edge-venv}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rapid-edge-check.XXXXXX")
CLOUD_PID=""; EDGE_PID=""
cleanup() {
  [ -n "$EDGE_PID" ] && kill "$EDGE_PID" 2>/dev/null
  [ -n "$CLOUD_PID" ] && kill "$CLOUD_PID" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "[edge-check] FAILED: $*" >&2; exit 1; }

PY=${PYTHON:-python3}
[ -x "$EV/bin/python" ] || "$PY" -m venv "$EV" || fail "could not create $EV"
echo "[edge-check] installing .[edge] into $EV (pip cache reused)"
if ! "$EV/bin/python" -m pip install -q --disable-pip-version-check -e ".[edge]" >"$WORK/pip.log" 2>&1; then
  tail -20 "$WORK/pip.log" >&2
  if grep -qiE "connection|resolve|network|timed out|No matching distribution|Could not find a version" "$WORK/pip.log"; then
    fail "pip could not reach the package registry to install .[edge] (onnxruntime, transformers, ... come from PyPI); this step needs the registry or a pip cache that holds them"
  fi
  fail "pip install -e '.[edge]' failed (log above)"
fi
"$EV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)" \
  || fail "torch is installed in $EV: the edge extra must not pull it in"

echo "[edge-check] building the tiny cloud, draft and ONNX export with .venv"
.venv/bin/python scripts/edge_check.py prepare "$WORK" >"$WORK/prepare.log" 2>&1 \
  || { tail -20 "$WORK/prepare.log" >&2; fail "preparing the tiny models/export failed"; }
port=$(.venv/bin/python -c "from rapid.core.procs import free_port; print(free_port())")
.venv/bin/python -m rapid.cli serve --target "$WORK/target" --port "$port" --dtype float64 >"$WORK/serve.log" 2>&1 &
CLOUD_PID=$!

"$EV/bin/rapid" edge --help >/dev/null || fail "rapid edge --help"
"$EV/bin/rapid" doctor >"$WORK/doctor.txt" 2>&1 || { cat "$WORK/doctor.txt" >&2; fail "rapid doctor"; }
grep -E "^onnxruntime .*really working \[.*CPUExecutionProvider" "$WORK/doctor.txt" >/dev/null \
  || { cat "$WORK/doctor.txt" >&2; fail "rapid doctor does not report ONNX Runtime's CPU provider as working"; }

expected=$(cat "$WORK/expected.txt")
for _ in $(seq 100); do  # the cloud listens within a few seconds
  "$EV/bin/python" -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.5)" 2>/dev/null && break
  sleep 0.3
done
got=$(timeout 120 "$EV/bin/rapid" generate "def add(a, b):" --draft "$WORK/export" --engine onnx \
      --cloud "ws://127.0.0.1:$port" --max-tokens 16 --capacity 256 2>"$WORK/generate.err") \
  || { cat "$WORK/generate.err" >&2; fail "rapid generate --engine onnx"; }
[ "$got" = "$expected" ] || fail "rapid generate --engine onnx: got $(printf %q "$got"), the target alone: $(printf %q "$expected")"

edge_port=$(.venv/bin/python -c "from rapid.core.procs import free_port; print(free_port())")
"$EV/bin/rapid" edge --draft "$WORK/export" --cloud "ws://127.0.0.1:$port" --listen "127.0.0.1:$edge_port" \
  --parallel 1 --capacity 256 >"$WORK/edge.log" 2>&1 &
EDGE_PID=$!
got=$(timeout 120 "$EV/bin/python" scripts/edge_check.py ask "http://127.0.0.1:$edge_port") \
  || { tail -20 "$WORK/edge.log" >&2; fail "a request to rapid edge --draft <export>"; }
[ "$got" = "$expected" ] || fail "rapid edge: got $(printf %q "$got"), the target alone: $(printf %q "$expected")"
echo "[edge-check] ok: .[edge] without torch ran edge --help, doctor, generate --engine onnx and rapid edge ($((SECONDS - t0)) s)"

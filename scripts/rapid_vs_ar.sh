#!/usr/bin/env bash
# Exactness end to end with real processes, as a user runs it: one `rapid serve` (pinned to the
# second core), then `rapid generate --chat` with --policy rapid and --policy ar for each draft and
# chat prompt; prints one line per (draft, prompt) and "N/M identical" at the end.
#   bash scripts/rapid_vs_ar.sh [DTYPE] [MAX_TOKENS]      e.g. bash scripts/rapid_vs_ar.sh float32 32
# Env: DRAFTS ("default-draft-int4 default-draft"), PORT (8799), plus anything rapid serve reads
# (RAPID_ROW_ISA=avx2 runs the AVX2 kernels: a CPU without AVX-512).
set -uo pipefail
cd "$(dirname "$0")/.."
DTYPE=${1:-auto}; MAX=${2:-32}; PORT=${PORT:-8799}; DRAFTS=${DRAFTS:-"default-draft-int4 default-draft"}
RAPID=.venv/bin/rapid
PROMPTS=("Explain in two sentences what a hash map is."
         "Write a Python function that checks whether a string is a palindrome."
         "What is a Dyson Sphere?"
         "Give me three tips for writing clear commit messages.")
LOG=$(mktemp -t rapid-vs-ar-XXXX.log)
taskset -c 1 $RAPID serve --target default-target --dtype "$DTYPE" --port "$PORT" > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 600); do
  grep -q "verifier listening" "$LOG" && break
  kill -0 $SERVER 2>/dev/null || { echo "rapid serve exited before listening:"; tail -3 "$LOG"; exit 1; }
  sleep 1
done
grep -E "dtype|verify mode|verify curve" "$LOG" | sed 's/^.*INFO rapid.server: /  serve: /'
same=0; total=0
for draft in $DRAFTS; do
  for p in "${PROMPTS[@]}"; do
    out_r=$(taskset -c 0 $RAPID generate --draft "$draft" --cloud "ws://127.0.0.1:$PORT" --policy rapid \
            --max-tokens "$MAX" --chat "$p" 2>/tmp/rapid_vs_ar.err)
    line=$(grep "^\[rapid\]" /tmp/rapid_vs_ar.err | tail -1)
    out_a=$(taskset -c 0 $RAPID generate --draft "$draft" --cloud "ws://127.0.0.1:$PORT" --policy ar \
            --max-tokens "$MAX" --chat "$p" 2>/dev/null)
    total=$((total + 1))
    if [ "$out_r" == "$out_a" ] && [ -n "$out_r" ]; then same=$((same + 1)); verdict=identical; else verdict=DIFFERENT; fi
    echo "$draft | ${p:0:40} | $verdict | ${line}"
  done
done
echo "$same/$total identical (dtype $DTYPE, $MAX tokens)"
[ "$same" -eq "$total" ]

#!/usr/bin/env bash
# Four real edge processes (default 0.5B draft each) share one `rapid serve` (default 1.5B target)
# on loopback; each output is compared with the target alone (policy ar). Needs ~18 GB RAM.
#   bash scripts/real_edges.sh [EDGES=4] [TOKENS=16] [MAX_BATCH=4]
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-4}; TOK=${2:-16}; MB=${3:-4}
PORT=$(.venv/bin/python -c "from rapid.core.procs import free_port; print(free_port())")
OUT=$(mktemp -d)
.venv/bin/rapid serve --port "$PORT" --max-batch "$MB" --batch-window-ms 20 > "$OUT/serve.log" 2>&1 &
SP=$!
trap 'kill $SP 2>/dev/null' EXIT
for _ in $(seq 120); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 1; done
PROMPTS=("def is_prime(n):" "def reverse_words(s):" "class Stack:" "def flatten(xs):" "def gcd(a, b):" "def mean(xs):")
t0=$(date +%s.%N)
for i in $(seq 0 $((N-1))); do
  .venv/bin/rapid generate --engine torch --cloud "ws://127.0.0.1:$PORT" --max-tokens "$TOK" "${PROMPTS[$i]}" \
    > "$OUT/edge$i.txt" 2> "$OUT/edge$i.err" &
done
wait $(jobs -p | grep -v "^$SP$") 2>/dev/null
t1=$(date +%s.%N)
echo "edges=$N tokens/edge=$TOK max_batch=$MB wall_s=$(echo "$t1 - $t0" | bc)"
for i in $(seq 0 $((N-1))); do
  .venv/bin/rapid generate --engine torch --cloud "ws://127.0.0.1:$PORT" --max-tokens "$TOK" --policy ar "${PROMPTS[$i]}" \
    > "$OUT/ref$i.txt" 2> "$OUT/ref$i.err"
  same=$(cmp -s "$OUT/edge$i.txt" "$OUT/ref$i.txt" && echo yes || echo NO)
  echo "edge $i: $(grep -h '^\[' "$OUT/edge$i.err") identical to target alone: $same"
done
grep -h "batch" "$OUT/serve.log" | tail -3

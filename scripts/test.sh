#!/usr/bin/env bash
# README's second command (and exactly what .ci/run runs): set up, the whole test suite, then the
# torch-free edge install checked end to end (scripts/edge_check.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 tests "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure of the suite, not a pass" >&2
  exit 1
fi
bash scripts/edge_check.sh
edge_rc=$?
[ "$rc" -ne 0 ] && exit "$rc"
exit "$edge_rc"

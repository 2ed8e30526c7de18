#!/usr/bin/env bash
# make demo's command (64 new tokens) with an empty $QUICKDRAFT_CACHE, timed; $1 = a worktree for older code (else this).
# The kernels are cached by torch outside it: code at another path rebuilds them once (see README).
set -euo pipefail
rm -rf /tmp/fresh
if [ -n "${1:-}" ]; then export PYTHONPATH="$1"; fi
QUICKDRAFT_CACHE=/tmp/fresh /usr/bin/time -f "wall %e s maxrss %M KB" .venv/bin/quickdraft generate --chat --compare \
    --max-new-tokens 64 "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and a short usage example. Reply with the code only." \
    2>&1 >/dev/null | grep -E "wall|calibrated|speedup"

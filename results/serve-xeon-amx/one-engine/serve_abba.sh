#!/usr/bin/env bash
# bench-serve before (6d6db7a) and after (the one engine), taking turns A B B A: one user at a time and all at once.
set -euo pipefail
ARGS="--num-prompts 20 --max-tokens 64 --rates seq,inf --configs plain=none,goodput-hy=hybrid+goodput --disconnect-fraction 0"
OUT=${OUT:-/work/measure/serve}
before() { (cd /work/before && QUICKDRAFT_CACHE=/work/cache-before TORCH_EXTENSIONS_DIR=/work/ext-before \
  PYTHONPATH=/work/before /work/main/.venv/bin/python -m quickdraft bench-serve $ARGS --out "$OUT/before-$1"); }
after() { (cd /work/main && QUICKDRAFT_CACHE=/work/cache-after TORCH_EXTENSIONS_DIR=/work/ext-after \
  PYTHONPATH=/work/main /work/main/.venv/bin/python -m quickdraft bench-serve $ARGS --out "$OUT/after-$1"); }
mkdir -p "$OUT"
date; before 1; date; after 1; date; after 2; date; before 2; date

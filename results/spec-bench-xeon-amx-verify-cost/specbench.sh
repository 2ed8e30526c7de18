#!/usr/bin/env bash
# Spec-Bench with the kernels before (3b3694f) and after (HEAD) this issue, one run each, after first.
set -euo pipefail
METHODS=baseline,hybrid+goodput,llama-cpp
COMMON="--per-category 5 --max-new-tokens 128 --methods $METHODS"
OUT=/work/measure/specbench31
before() { (cd /work/before31 && QUICKDRAFT_CACHE=/work/cache-after TORCH_EXTENSIONS_DIR=/work/ext-before31 \
  PYTHONPATH=/work/before31 /work/main/.venv/bin/python -m quickdraft bench $COMMON --runs "$1" --out "$OUT/before"); }
after() { (cd /work/main && QUICKDRAFT_CACHE=/work/cache-after TORCH_EXTENSIONS_DIR=/work/ext-eagle \
  PYTHONPATH=/work/main /work/main/.venv/bin/python -m quickdraft bench $COMMON --runs "$1" --out "$OUT/${AFTER_DIR:-after}"); }
date; after "${RUNS:-1}"; date

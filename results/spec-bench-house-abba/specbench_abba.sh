#!/usr/bin/env bash
# Spec-Bench before (809d07f) and after issue 42's changes, taking turns A B B A, one run each turn: each version
# resumes its own output directory, so each ends with 2 runs of every question. `control` is plain decoding again
# as a method of its own: the A/A control of the bench's noise within each run.
set -euo pipefail
METHODS=baseline,control,hybrid+goodput
COMMON="--per-category 2 --max-new-tokens 128 --methods $METHODS"
before() { (cd /work/ref && QUICKDRAFT_CACHE=/work/cache-before TORCH_EXTENSIONS_DIR=/work/ext-before \
  PYTHONPATH=/work/ref /work/main/.venv/bin/python -m quickdraft bench $COMMON --runs "$1" --out "$OUT/before"); }
after() { (cd /work/after && QUICKDRAFT_CACHE=/work/cache-after TORCH_EXTENSIONS_DIR=/work/ext-after \
  PYTHONPATH=/work/after /work/main/.venv/bin/python -m quickdraft bench $COMMON --runs "$1" --out "$OUT/after"); }
OUT=${OUT:-/work/measure/specbench}
mkdir -p "$OUT"
date; before 1; date; after 1; date; after 2; date; before 2; date

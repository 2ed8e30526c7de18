#!/usr/bin/env bash
# Spec-Bench before (6d6db7a) and after (the one engine), taking turns A B B A, one run each turn:
# each version resumes its own output directory, so each ends with 2 runs of every question.
set -euo pipefail
METHODS=baseline,hybrid+goodput,llama-cpp
COMMON="--per-category 5 --max-new-tokens 128 --methods $METHODS"
before() { (cd /work/before && QUICKDRAFT_CACHE=/work/cache-before TORCH_EXTENSIONS_DIR=/work/ext-before \
  PYTHONPATH=/work/before /work/main/.venv/bin/python -m quickdraft bench $COMMON --runs "$1" --out "$OUT/before"); }
after() { (cd /work/main && QUICKDRAFT_CACHE=/work/cache-after TORCH_EXTENSIONS_DIR=/work/ext-after \
  PYTHONPATH=/work/main /work/main/.venv/bin/python -m quickdraft bench $COMMON --runs "$1" --out "$OUT/after"); }
OUT=${OUT:-/work/measure/specbench}
mkdir -p "$OUT"
date; before 1; date; after 1; date; after 2; date; before 2; date

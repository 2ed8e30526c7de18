#!/usr/bin/env bash
# Issue 30, second session (2026-11-26): the measurements, one after another on the otherwise quiet machine.
# Run before it, alone (42 minutes):
#   quickdraft train-draft --model draft --data /work/draft-data/qwen-1.5b --shards 8 --out /work/distilled/qwen-0.5b-e1
set -euo pipefail
cd /work/main
export QUICKDRAFT_CACHE=/work/cache-after TORCH_EXTENSIONS_DIR=/work/ext-eagle
PY=/work/main/.venv/bin/python
R=/work/main/results/draft-head-xeon-amx
OUT=/work/measure/issue30
HEAD=/work/draft-heads/lr1e-3.safetensors
mkdir -p "$OUT"
date
# 1. how held-out agreement grows with data: the default recipe on the first 1, 2, 4 training shards
for n in 1 2 4; do
  [ -f "/work/draft-heads/curve-$n.safetensors" ] || $PY "$R/learning_curve.py" "$n" "/work/draft-heads/curve-$n.safetensors"
  date
done
# 2. Spec-Bench, greedy and sampled (T 0.7, seed 1): plain, the default, hybrid-eagle with the lr1e-3 head
for t in greedy 0.7; do
  extra=(); [ "$t" != greedy ] && extra=(--temperature "$t" --seed 1)
  $PY -m quickdraft bench --per-category 5 --max-new-tokens 128 --methods baseline,hybrid+goodput,hybrid-eagle+goodput \
    --draft-head "$HEAD" "${extra[@]}" --out "$OUT/specbench-$t"
  date
done

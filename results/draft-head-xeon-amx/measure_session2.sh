#!/usr/bin/env bash
# Issue 30, second session (2026-11-26): the measurements, one after another on the otherwise quiet machine.
set -euo pipefail
cd /work/main
export QUICKDRAFT_CACHE=/work/cache-after TORCH_EXTENSIONS_DIR=/work/ext-eagle
PY=/work/main/.venv/bin/python
R=/work/main/results/draft-head-xeon-amx
OUT=/work/measure/issue30
HEAD=/work/draft-heads/lr1e-3.safetensors
mkdir -p "$OUT"
while pgrep -f "train-draft --model draft" > /dev/null; do sleep 20; done  # the distillation runs first
date
# 1. how held-out agreement grows with data: the default recipe on the first 1, 2, 4 training shards
for n in 1 2 4; do $PY "$R/learning_curve.py" "$n" "/work/draft-heads/curve-$n.safetensors"; date; done
# 2. the untrained draft in the distilled draft's form (the control)
$PY "$R/untrained_control.py"
# 3. Spec-Bench, greedy and sampled (T 0.7, seed 1): plain, the default, hybrid-eagle with the lr1e-3 head
for t in greedy 0.7; do
  extra=(); [ "$t" != greedy ] && extra=(--temperature "$t" --seed 1)
  $PY -m quickdraft bench --per-category 5 --max-new-tokens 128 --methods baseline,hybrid+goodput,hybrid-eagle+goodput \
    --draft-head "$HEAD" "${extra[@]}" --out "$OUT/specbench-$t"
  date
done
# 4. the distilled draft against the untrained one, both quantized from bfloat16 the same way
for d in untrained e1; do
  $PY -m quickdraft bench --per-category 3 --max-new-tokens 128 --methods baseline,hybrid+goodput \
    --draft "/work/distilled/qwen-0.5b-$d" --draft-weights q4 --out "$OUT/draft-$d"
  date
done

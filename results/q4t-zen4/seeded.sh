#!/bin/bash
cd /work/q4t
for side in before after; do
  if [ $side = after ]; then root=/work/main; else root=/work/before; fi
  PYTHONPATH=$root timeout 900 /work/main/.venv/bin/python -m quickdraft bench --target /work/q4t/target-q4_0.gguf --per-category 2 --max-new-tokens 128 --temperature 0.7 --seed 1 --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 --out q40-seeded-$side > q40-seeded-$side.log 2>&1
done
echo done > seeded.done

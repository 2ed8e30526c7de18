#!/bin/bash
# second round, reverse order: before (4f06f61) then after (856667b)
cd /work/iq2/abs
for kind in iq1s iq2s; do
  F=/work/iq2/target-$kind-random.gguf
  for v in old new; do
    PYTHONPATH=/work/$v /work/main/.venv/bin/python -m quickdraft bench --target $F --per-category 1 --max-new-tokens 64 \
      --methods baseline,llama-cpp --warmup 1 --out /work/iq2/abs/$kind-$v-2 > $kind-$v-2.log 2>&1
  done
done
echo done

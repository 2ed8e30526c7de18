#!/bin/bash
# IQ2_XXS random file: before (4f06f61, 7-bit int8) and after (2d79778, iq4 with IQ2_XXS's table), in turns
cd /work/iq2/ab
F=/work/iq2/target-iq2xxs-random.gguf
i=0
for v in new old old new new old; do
  i=$((i+1))
  PYTHONPATH=/work/$v /work/main/.venv/bin/python -m quickdraft profile --model $F --context 512 --placeholder-context \
    --max-k 8 --repeats 9 --json > prof-$v-$i.json 2>> err.log
done
for v in new old; do
  PYTHONPATH=/work/$v /work/main/.venv/bin/python -m quickdraft bench --target $F --per-category 1 --max-new-tokens 64 \
    --methods baseline,llama-cpp --warmup 1 --out /work/iq2/ab/bench-$v > bench-$v.log 2>&1
done
echo done

#!/bin/bash
# random IQ2_S and IQ1_S files: after (856667b: iq4h / iq4 with their tables) then before (4f06f61: 7-bit int8)
cd /work/iq2/abs
for kind in iq2s iq1s; do
  F=/work/iq2/target-$kind-random.gguf
  for v in new old; do
    PYTHONPATH=/work/$v /work/main/.venv/bin/python -m quickdraft bench --target $F --per-category 1 --max-new-tokens 64 \
      --methods baseline,llama-cpp --warmup 1 --out /work/iq2/abs/$kind-$v > $kind-$v.log 2>&1
  done
done
echo done

#!/bin/bash
# Greedy A/B on the IQ3_S file: before (c8d55a0: IQ3_S in 7 bits) and after (IQ3_S as q6), in turns.
cd /work/iq3
run() {  # name, code directory
  PYTHONPATH=$2 timeout 1800 /work/main/.venv/bin/python -m quickdraft bench --target /work/iq3/target-iq3s.gguf \
    --per-category 2 --max-new-tokens 128 --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 \
    --out /work/iq3/$1 > /work/iq3/$1.log 2>&1
  echo "rc=$?" >> /work/iq3/$1.log
}
run greedy-after /work/new; run greedy-after-2 /work/new; run greedy-before-2 /work/old

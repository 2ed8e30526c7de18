#!/bin/bash
# Seeded T 0.7 on the IQ3_S file: after (e9d6156: IQ3_S as q6) then before (c8d55a0: 7 bits).
cd /work/iq3
run() {  # name, code directory
  PYTHONPATH=$2 timeout 1800 /work/main/.venv/bin/python -m quickdraft bench --target /work/iq3/target-iq3s.gguf \
    --per-category 2 --max-new-tokens 128 --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 \
    --temperature 0.7 --seed 1 --out /work/iq3/$1 > /work/iq3/$1.log 2>&1
  echo "rc=$?" >> /work/iq3/$1.log
}
run seeded-after /work/new; run seeded-before /work/old

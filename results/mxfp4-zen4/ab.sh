#!/bin/bash
# A/B of the MXFP4 file: before (64a8280: MXFP4 in 7 bits) and after (bddd7c0: MXFP4 as q4t), in turns.
set -u
F=/work/mx/target-mxfp4.gguf
prof() {  # $1 label, $2 source dir
  echo "== $1"
  (cd /tmp && PYTHONPATH=$2 /work/main/.venv/bin/python -m quickdraft profile --model $F --context 512 --placeholder-context --max-k 8 --repeats 5 --json 2>/dev/null)
}
bench() {  # $1 name, $2 code directory
  (cd /tmp && PYTHONPATH=$2 timeout 2400 /work/main/.venv/bin/python -m quickdraft bench --target $F \
    --per-category 1 --max-new-tokens 64 --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 \
    --out /work/mx/$1 > /work/mx/$1.log 2>&1; echo "rc=$?" >> /work/mx/$1.log)
}
prof after /work/new; prof before /work/old; prof after /work/new; prof before /work/old
bench greedy-after /work/new; bench greedy-before /work/old

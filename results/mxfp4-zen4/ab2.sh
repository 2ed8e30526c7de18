#!/bin/bash
set -u
F=/work/mx/target-mxfp4.gguf
bench() {  # $1 name, $2 code directory
  (cd /tmp && PYTHONPATH=$2 timeout 2400 /work/main/.venv/bin/python -m quickdraft bench --target $F \
    --per-category 1 --max-new-tokens 64 --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 \
    --out /work/mx/$1 > /work/mx/$1.log 2>&1; echo "rc=$?" >> /work/mx/$1.log)
}
bench greedy-before-2 /work/old; bench greedy-after-2 /work/new

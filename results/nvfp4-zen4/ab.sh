#!/bin/bash
# The NVFP4 file: perplexity (as stored and 7 bits, llama.cpp), then the bench before (bddd7c0: NVFP4 in 7 bits) and
# after (f7edc67: NVFP4 as iq4h where it fits), in turns.
set -u
F=/work/mx/target-nvfp4.gguf
(cd /tmp && PYTHONPATH=/work/nv2 timeout 1800 /work/main/.venv/bin/python /work/nv2/tools/perplexity.py --models $F \
  --formats auto,int8 --kv-cache-dtypes float16 --source-tokens 1024 --against-llama-cpp 2>&1 | grep -E 'tokens\)' > /work/mx/nv-perplexity-1024.txt)
bench() {  # $1 name, $2 code directory
  (cd /tmp && PYTHONPATH=$2 timeout 2400 /work/main/.venv/bin/python -m quickdraft bench --target $F \
    --per-category 1 --max-new-tokens 64 --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 \
    --out /work/mx/nv-$1 > /work/mx/nv-$1.log 2>&1; echo "rc=$?" >> /work/mx/nv-$1.log)
}
bench greedy-after /work/nv2; bench greedy-before /work/new; bench greedy-before-2 /work/new; bench greedy-after-2 /work/nv2

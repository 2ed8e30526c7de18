#!/bin/bash
# A/B of a random-weight Llama-3.2-1B-shape Q4_K_M file's cost curve: before (887fd20: Llama q/k in 7 bits) and after
# (bfd329b: q/k as stored), in turns.
set -u
F=/work/llama1b/llama-3.2-1b-random-Q4_K_M.gguf
run() {  # $1 label, $2 source dir
  echo "== $1"
  (cd /tmp && PYTHONPATH=$2 /work/main/.venv/bin/python -m quickdraft profile --model $F --context 512 --placeholder-context --max-k 8 --repeats 9 --json 2>&1 | grep -v "it/s\]\|%|")
}
for i in 1 2 3; do run before /work/new; run after /work/main; run after /work/main; run before /work/new; done

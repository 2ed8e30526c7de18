#!/bin/bash
cd /work/q4t
run() {  # run TAG SIDE FILE
  if [ $2 = after ]; then root=/work/main; else root=/work/before; fi
  PYTHONPATH=$root timeout 1500 /work/main/.venv/bin/python -m quickdraft bench --target $3 --per-category 2 --max-new-tokens 128 --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 --out $1-$2 > $1-$2.log 2>&1
}
run q40b before /work/q4t/target-q4_0.gguf
run q40b after /work/q4t/target-q4_0.gguf
run iq4nl after /work/iq4nl/target-iq4nl.gguf
run iq4nl before /work/iq4nl/target-iq4nl.gguf
echo done > benches.done

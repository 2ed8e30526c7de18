#!/bin/bash
i=0
for side in A B B A A B B A; do
  i=$((i+1))
  dir=/work/base; [ $side = B ] && dir=/work/main
  (cd $dir && QUICKDRAFT_NATIVE_NO_AMX=1 /work/main/.venv/bin/python -m quickdraft profile --model /work/big/qwen2.5-7b-random-Q4_K_M.gguf --max-k 8 --repeats 9 --json > results/q4-fma-xeon/profile-7b-noamx/$i-$side.json 2>results/q4-fma-xeon/profile-7b-noamx/$i-$side.err)
  date >> results/q4-fma-xeon/profile-7b-noamx/log
done

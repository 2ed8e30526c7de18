#!/bin/bash
# ABBA profile of the default target: A = /work/base, B = /work/main
i=0
for round in 1 2 3; do
  for side in A B B A; do
    i=$((i+1))
    dir=/work/base; [ $side = B ] && dir=/work/main
    (cd $dir && /work/main/.venv/bin/python -m quickdraft profile --model target --context 512 --max-k 16 --repeats 5 --json > results/q4-fma-xeon/profile-abba-q6/$i-$side.json 2>/dev/null)
  done
done

#!/bin/bash
# Before (3b3694f) and after (HEAD) kernels, alternated: GEMM speed and the target's cost curve, with and without AMX.
set -x
M=/work/measure/issue31c
cd /work/main
F="-std=c++17 -O3 -march=native -ffp-contract=off -fopenmp"
NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
g++ $F $NOAMX -I/work/before31/quickdraft/runtime/native tools/gemm_speed.cpp -o $M/gs_before
g++ $F $NOAMX -Iquickdraft/runtime/native tools/gemm_speed.cpp -o $M/gs_after
for i in 1 2; do
  $M/gs_before > $M/gemm-before-$i.txt
  $M/gs_after > $M/gemm-after-$i.txt
done
export QUICKDRAFT_CACHE=/work/cache-after
for i in 1 2; do
  for v in 1 0; do
    (cd /work/before31 && TORCH_EXTENSIONS_DIR=/work/ext-before31 QUICKDRAFT_NATIVE_NO_AMX=$v /work/main/.venv/bin/python -m quickdraft profile --model target --context 512 --json > $M/profile-before-noamx$v-$i.json 2>$M/profile-before-noamx$v-$i.err)
    TORCH_EXTENSIONS_DIR=/work/ext-eagle QUICKDRAFT_NATIVE_NO_AMX=$v .venv/bin/quickdraft profile --model target --context 512 --json > $M/profile-after-noamx$v-$i.json 2>$M/profile-after-noamx$v-$i.err
  done
done
echo done > $M/done

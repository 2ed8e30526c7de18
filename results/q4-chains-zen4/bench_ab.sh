#!/bin/bash
# greedy Spec-Bench, 12 questions, old then new then new then old (worktrees)
cd /work/ab/bench
for v in old new new old; do
  n=$(ls -d $v-* 2>/dev/null | wc -l)
  PYTHONPATH=/work/$v /work/main/.venv/bin/python -m quickdraft bench --per-category 2 --max-new-tokens 128 \
    --methods baseline,hybrid-suffix+goodput,llama-cpp --warmup 1 --out /work/ab/bench/$v-$n > /work/ab/bench/$v-$n.log 2>&1
done
echo done

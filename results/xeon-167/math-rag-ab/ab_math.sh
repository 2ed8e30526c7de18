#!/bin/bash
# HEAD then a776e52 (before the q4 change), math_reasoning and rag only, greedy, fresh processes, from /tmp.
cd /tmp
Q="/work/main/.venv/bin/python -m quickdraft bench --per-category 5 --max-new-tokens 128 --methods baseline,hybrid-suffix+goodput --warmup 1 --categories math_reasoning,rag"
$Q --out /work/runs/ab-head-1 > /work/runs/ab-head-1.log 2>&1
PYTHONPATH=/work/before $Q --out /work/runs/ab-before-1 > /work/runs/ab-before-1.log 2>&1

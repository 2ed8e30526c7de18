#!/bin/bash
# profile the default target in turns: old new new old ...
cd /work/ab
for i in 1 2 3; do
  for v in old new new old; do
    PYTHONPATH=/work/$v /work/main/.venv/bin/python -m quickdraft profile --context 512 --placeholder-context --max-k 8 --repeats 9 --json > prof-$v-$i-$RANDOM.json 2>> err.log
  done
done
echo done

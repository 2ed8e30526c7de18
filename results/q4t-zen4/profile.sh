#!/bin/bash
# profile.sh FILE TAG ROUNDS: cost curves after (/work/main) and before (/work/before) taking turns
file=$1; tag=$2; rounds=${3:-3}
cd /work/q4t
for r in $(seq 1 $rounds); do
  for side in after before; do
    if [ $side = after ]; then root=/work/main; else root=/work/before; fi
    PYTHONPATH=$root /work/main/.venv/bin/python -m quickdraft profile --model $file --context 512 --placeholder-context --max-k 8 --repeats 5 --json > profile-$tag-$side-$r.json 2> profile-$tag-$side-$r.err
    echo "$tag $side $r $(python3 -c "import json,sys; d=json.load(open('profile-$tag-$side-$r.json')); print(d)" | cut -c1-300)"
  done
done

#!/bin/bash
# Prompt reading, two checkouts in fresh processes taking turns A B B A (A: $BEFORE, B: $AFTER):
# `quickdraft profile --model M --prefill TOKENS --repeats 3 --json` for each model, PAIRS such turns of four each;
# with AGAINST=llama-cpp each process also times llama.cpp reading the same tokens from the same GGUF file.
#   BEFORE=/path/old AFTER=/path/new [AGAINST=llama-cpp] tools/prefill_abba.sh OUT TOKENS PAIRS MODEL...
# Writes OUT/NN-MODELNAME-{before,after}.json and prints one line per process (prompt tokens/s, llama.cpp's, ratio).
# It runs from /tmp: `python -m quickdraft` puts the working directory first on sys.path, ahead of PYTHONPATH.
set -euo pipefail
out=$(realpath -m "$1"); tokens=$2; pairs=$3; shift 3
python=${PYTHON:-$AFTER/.venv/bin/python}
against=()
[ -n "${AGAINST:-}" ] && against=(--against "$AGAINST")
mkdir -p "$out"; cd /tmp; i=0
for model in "$@"; do
  for _ in $(seq "$pairs"); do
    for arm in before after after before; do
      i=$((i + 1)); tree=$BEFORE; [ $arm = after ] && tree=$AFTER
      file=$out/$(printf %02d $i)-$(basename "$model" .gguf)-$arm.json
      PYTHONPATH=$tree "$python" -m quickdraft profile --model "$model" --prefill "$tokens" --repeats 3 \
        "${against[@]}" --json > "$file" 2>> "$out/err.log"
      "$python" -c "import json, sys; p = json.load(open(sys.argv[1]))['prefill']; l = p.get('llama_cpp') or {}
print(sys.argv[2], p['quickdraft']['tokens_per_s'], l.get('tokens_per_s', ''), p.get('ratio', ''))" "$file" "$(basename "$file" .json)"
    done
  done
done

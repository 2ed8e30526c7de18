#!/bin/bash
# A/B of the IQ3_S file's cost curve: before (c8d55a0: IQ3_S in 7 bits) and after (887fd20: IQ3_S as q6), in turns.
set -u
F=/work/iq3/target-iq3s.gguf
run() {  # $1 label, $2 source dir
  echo "== $1"
  (cd /tmp && PYTHONPATH=$2 /work/main/.venv/bin/python -m quickdraft profile --model $F --context 512 --placeholder-context --max-k 8 --repeats 5 --json 2>/dev/null)
}
run before /work/old; run after /work/new; run after /work/new; run before /work/old

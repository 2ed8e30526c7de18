#!/bin/bash
# Fresh processes taking turns A B B A (A: the checkout in $BEFORE, B: /work/main), reading a 1024-token prompt.
# Run from a directory holding neither checkout: `python -m` puts the working directory first on sys.path.
out=$1; mkdir -p $out; cd /tmp; i=0
for model in target draft; do
  for pair in 1 2 3; do
    for tree in $BEFORE /work/main /work/main $BEFORE; do
      i=$((i+1))
      PYTHONPATH=$tree /work/main/.venv/bin/python -m quickdraft profile --model $model --prefill 1024 --repeats 3 --json > $out/$(printf %02d $i)-$model-$(basename $tree).json 2>>$out/err.log
    done
  done
done

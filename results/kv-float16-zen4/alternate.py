"""The same as cost_curves.py in many short turns: for each context, ROUNDS rounds in which each cache's t(1) and
t(8) (fastest of 3 after a warm-up) are measured in turn, the order swapped every round; prints each turn.

    python results/kv-float16-zen4/alternate.py 512,16384 8 > results/kv-float16-zen4/alternate.jsonl
"""

from __future__ import annotations

import json
import sys

from quickdraft.costs.calibration import measure_cost_curve
from quickdraft.models import DEFAULT_TARGET, resolve_model
from quickdraft.runtime.base import LoadOptions
from quickdraft.runtime.native import NativeRuntime

contexts, rounds = [int(text) for text in sys.argv[1].split(",")], int(sys.argv[2])
path = resolve_model(DEFAULT_TARGET)
runtimes = {dtype: NativeRuntime.load(path, LoadOptions(kv_cache_dtype=dtype)) for dtype in ("float16", "float32")}
for context in contexts:
    for round_ in range(rounds):
        for dtype in ("float16", "float32")[:: 1 if round_ % 2 == 0 else -1]:
            curve = measure_cost_curve(runtimes[dtype], [1, 8], context, repeats=3, warmup=1, placeholder=True)
            print(json.dumps({"context": context, "kv_cache_dtype": dtype, "round": round_, "t_ms": curve}), flush=True)

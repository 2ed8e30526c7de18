"""t(k) of the default target with a float16 and a float32 KV cache at several contexts, taking turns.

    python results/kv-float16-zen4/cost_curves.py 512,4096,16384 > results/kv-float16-zen4/cost_curves.jsonl

Both runtimes load the same packed weights; each curve is quickdraft.costs.calibration's (placeholder context,
fastest of 5 after a warm-up), the two caches in turn, the order swapped in the second round.
"""

from __future__ import annotations

import json
import sys

from quickdraft.costs.calibration import measure_cost_curve
from quickdraft.models import DEFAULT_TARGET, resolve_model
from quickdraft.runtime.base import LoadOptions
from quickdraft.runtime.native import NativeRuntime

contexts = [int(text) for text in sys.argv[1].split(",")]
path = resolve_model(DEFAULT_TARGET)
runtimes = {dtype: NativeRuntime.load(path, LoadOptions(kv_cache_dtype=dtype)) for dtype in ("float16", "float32")}
for context in contexts:
    for round_, order in enumerate((("float16", "float32"), ("float32", "float16"))):
        for dtype in order:
            curve = measure_cost_curve(runtimes[dtype], [1, 4, 8, 16], context, repeats=5, warmup=1, placeholder=True)
            row = {"context": context, "kv_cache_dtype": dtype, "round": round_, "t_ms": curve}
            print(json.dumps(row), flush=True)

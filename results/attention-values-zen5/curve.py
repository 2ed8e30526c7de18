"""t(1) and t(8) of the default target after CONTEXTS cached tokens (fastest of 3 after a warm-up), float16 caches;
run with PYTHONPATH at a checkout of either build, alternating (end_to_end.jsonl):
    for round in 0 1 2; do for b in base new; do PYTHONPATH=<checkout of $b> python curve.py $b 4096,16384; done; done
"""

import json
import sys

from quickdraft.costs.calibration import measure_cost_curve
from quickdraft.models import DEFAULT_TARGET, resolve_model
from quickdraft.runtime.base import LoadOptions
from quickdraft.runtime.native import NativeRuntime

runtime = NativeRuntime.load(resolve_model(DEFAULT_TARGET), LoadOptions())
for context in [int(text) for text in sys.argv[2].split(",")]:
    curve = measure_cost_curve(runtime, [1, 8], context, repeats=3, warmup=1, placeholder=True)
    print(json.dumps({"build": sys.argv[1], "context": context, "t_ms": curve}), flush=True)

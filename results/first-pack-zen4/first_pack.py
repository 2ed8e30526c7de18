"""Pack the default pair's weights with an empty native cache entry: seconds and the packed file's bytes, as JSON.

Run with the code to measure first on the path (``PYTHONPATH=<worktree>`` for an older commit)."""

import json
import shutil
import time
from pathlib import Path

import quickdraft
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.entries import native_cache_dir
from quickdraft.runtime.native.weights import load_native_state

out: dict[str, object] = {"code": quickdraft.__file__}
for name, weights in (("qwen2.5-coder-1.5b-instruct", "auto"), ("qwen2.5-coder-0.5b-instruct", "q4")):
    path = Path.home() / ".cache/quickdraft/models" / name / "hf"
    config = DecoderConfig.from_dir(path)
    entry = native_cache_dir(path, weights)
    shutil.rmtree(entry, ignore_errors=True)
    start = time.perf_counter()
    load_native_state(path, config, weights)
    seconds = time.perf_counter() - start
    out[name] = {"seconds": round(seconds, 2), "bytes": (entry / "weights.safetensors").stat().st_size}
print(json.dumps(out))

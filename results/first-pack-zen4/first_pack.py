import time, shutil, json, sys
from pathlib import Path
import quickdraft
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.weights import load_native_state, native_cache_dir
out = {"code": quickdraft.__file__}
for d, w in (("qwen2.5-coder-1.5b-instruct", "auto"), ("qwen2.5-coder-0.5b-instruct", "q4")):
    path = Path.home() / ".cache/quickdraft/models" / d / "hf"
    cfg = DecoderConfig.from_dir(path)
    entry = native_cache_dir(path, w)
    shutil.rmtree(entry, ignore_errors=True)
    s = time.perf_counter(); state = load_native_state(path, cfg, w); t = time.perf_counter() - s
    out[d] = {"seconds": round(t, 2), "bytes": (entry / "weights.safetensors").stat().st_size}
print(json.dumps(out))

import sys, torch
from pathlib import Path
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main/tools")
from quickdraft.runtime.native import formats
from quickdraft.runtime.native.parts import Q8Part
ORIG = formats.PART_KINDS['int8']
from quickdraft.models import load_tokenizer, resolve_model
from quickdraft.models.loading import load_hf_model
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime
from test_real_models import GUARD_TEXT, perplexity
for name in sys.argv[1:]:
    path = resolve_model(name)
    ids = torch.tensor([load_tokenizer(path)(GUARD_TEXT).input_ids])
    with torch.no_grad():
        ref = perplexity(load_hf_model(path)(ids).logits, ids)
    line = f"{name} fp32 {ref:.3f}"
    import os; os.environ["QUICKDRAFT_CACHE"] = "/tmp/qc"; formats.PART_KINDS["int8"] = ORIG
    for label in ("int8", "q8"):
        if label == "q8":
            formats.PART_KINDS["int8"] = Q8Part
            import os; os.environ["QUICKDRAFT_CACHE"] = "/tmp/qc2"
        rt = NativeRuntime.load(path, LoadOptions("int8"))
        kinds = {type(p).kind for layer in rt.decoder.layers for p in layer.qkv.parts}
        ppl = perplexity(rt.forward(ids, rt.new_cache()), ids)
        line += f", {label}{sorted(kinds)} {ppl:.3f} ({100*(ppl/ref-1):+.2f} %)"
    print(line, flush=True)

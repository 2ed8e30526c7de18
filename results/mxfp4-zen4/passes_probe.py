"""Perplexity on the first 1,024 tokens of the standard library's source (tools/perplexity.py's --source-tokens) of
a Qwen2 GGUF file's native runtime, as stored (auto) and in 7 bits (int8), with the layers' activations in one 8-bit
pass (the family's rule) and in two (about 15 bits, Gemma's rule), against transformers' fp32.

    PYTHONPATH=. .venv/bin/python results/mxfp4-zen4/passes_probe.py FILE.gguf
"""

import dataclasses
import sys

import torch

sys.path.insert(0, "tests")
sys.path.insert(0, "tools")
from perplexity import perplexity, source_lines

from quickdraft.models import load_tokenizer, resolve_model
from quickdraft.models.loading import load_hf_model
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime, architecture

path = resolve_model(sys.argv[1])
ids = torch.tensor([load_tokenizer(path)("".join(source_lines())).input_ids[:1024]])  # [1, T]
with torch.no_grad():
    ref = perplexity(load_hf_model(path)(ids).logits, ids)
line = f"{sys.argv[1]}: fp32 {ref:.3f}"
base = architecture.ARCHITECTURES["qwen2"]
for passes in (1, 2):
    architecture.ARCHITECTURES["qwen2"] = dataclasses.replace(base, activation_passes=passes)
    for weights in ("auto", "int8"):
        runtime = NativeRuntime.load(path, LoadOptions(weights, kv_cache_dtype="float16"))
        assert runtime.decoder.layers[0].qkv.passes == passes
        native = perplexity(runtime.forward(ids, runtime.new_cache()), ids)
        line += f", {weights} passes {passes} {native:.3f} ({100 * (native / ref - 1):+.2f} %)"
print(line, flush=True)

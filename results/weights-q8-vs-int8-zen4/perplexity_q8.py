"""Perplexity of the default pair with every linear weight quantized from its floats, in 7 bits per channel (int8)
and in Q8_0's structure (q8), against transformers' fp32 model, on the guard text of tests/test_real_models.py.

A throwaway experiment: q8 is obtained by swapping the int8 format's class in PART_KINDS, packing into a cache of its
own (``/tmp/qc2``, beside ``$QUICKDRAFT_CACHE``'s models: ``ln -s ~/.cache/quickdraft/models /tmp/qc2/models``)."""

import os
import sys

import torch

sys.path.insert(0, "tests")
from test_real_models import GUARD_TEXT, perplexity

from quickdraft.models import load_tokenizer, resolve_model
from quickdraft.models.loading import load_hf_model
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime, formats
from quickdraft.runtime.native.parts import Q8Part

INT8 = formats.PART_KINDS["int8"]
CACHES = {"int8": os.environ.get("QUICKDRAFT_CACHE", "/tmp/qc"), "q8": "/tmp/qc2"}

for name in sys.argv[1:]:
    path = resolve_model(name)
    token_ids = torch.tensor([load_tokenizer(path)(GUARD_TEXT).input_ids])  # [1, T]
    with torch.no_grad():
        reference = perplexity(load_hf_model(path)(token_ids).logits, token_ids)
    line = f"{name} fp32 {reference:.3f}"
    for label, part in (("int8", INT8), ("q8", Q8Part)):
        formats.PART_KINDS["int8"] = part
        os.environ["QUICKDRAFT_CACHE"] = CACHES[label]
        runtime = NativeRuntime.load(path, LoadOptions("int8"))
        kinds = sorted({type(p).kind for layer in runtime.decoder.layers for p in layer.qkv.parts})
        native = perplexity(runtime.forward(token_ids, runtime.new_cache()), token_ids)
        line += f", {label}{kinds} {native:.3f} ({100 * (native / reference - 1):+.2f} %)"
    print(line, flush=True)

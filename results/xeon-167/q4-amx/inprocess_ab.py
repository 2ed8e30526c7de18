"""In-process A/B of reading a prompt: one loaded model, its compiled layers built from two kernel modules (A: the
kernels of the tree in $BEFORE, B: this tree's), taking turns A B B A; a turn is the fastest of 2 reads.
usage: BEFORE=/path/to/checkout python inprocess_ab.py target|draft TOKENS ROUNDS"""

import importlib.util
import os
import sys
import time

import torch

import quickdraft.runtime.native.model as model_module
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_tokenizer, resolve_model
from quickdraft.runtime import runtime_for
from quickdraft.runtime.device import resolve_device
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.options import draft_load_options

which_model, tokens, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before_path = os.environ["BEFORE"] + "/quickdraft/runtime/native/kernels.py"
spec = importlib.util.spec_from_file_location("before_kernels", before_path)
before_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before_module)
kernels = {"A": before_module.native_kernels(), "B": native_kernels()}
assert kernels["A"] is not kernels["B"]

path = resolve_model({"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}[which_model], progress=False)
runtime_cls = runtime_for("auto", path, resolve_device("cpu"))
draft = which_model == "draft"
weights, vocabulary = (None, None) if draft else ("auto", 0)  # as `quickdraft profile` loads each model
options = draft_load_options(runtime_cls, load_tokenizer(path), weights, vocabulary, resolve_device("cpu"))
runtime = runtime_cls.load(path, options)
decoders = [obj for obj in vars(runtime).values() if isinstance(obj, model_module.Decoder)]
assert decoders, vars(runtime).keys()
token_ids = torch.randint(0, 50000, (1, tokens), generator=torch.Generator().manual_seed(0))


def read(name: str) -> float:
    model_module.native_kernels = lambda: kernels[name]
    for decoder in decoders:
        decoder._layers_spec = None
    best = 1e9
    for _ in range(2):
        started = time.perf_counter()
        runtime.forward(token_ids, runtime.new_cache(1), last_only=True)
        best = min(best, time.perf_counter() - started)
    return best


outputs = {}
for name in ("A", "B"):
    model_module.native_kernels = lambda name=name: kernels[name]
    for decoder in decoders:
        decoder._layers_spec = None
    outputs[name] = runtime.forward(token_ids[:, :300], runtime.new_cache(1), last_only=True)
print("last logits, same bits:", torch.equal(outputs["A"], outputs["B"]) if torch.is_tensor(outputs["A"]) else "n/a")
ratios = []
for r in range(rounds):
    a1, b1, b2, a2 = read("A"), read("B"), read("B"), read("A")
    ratio = (a1 + a2) / (b1 + b2)
    ratios.append(ratio)
    speeds = f"A {tokens / a1:.1f} {tokens / a2:.1f}  B {tokens / b1:.1f} {tokens / b2:.1f} tokens/s"
    print(f"round {r + 1}: {speeds}  B over A {ratio:.3f}", flush=True)
mean = sum(ratios) / len(ratios)
print(f"{which_model} {tokens} tokens: B over A (speed) {min(ratios):.3f}-{max(ratios):.3f}, mean {mean:.3f}")

"""How far is each native weight format from the transformers fp32 model, by the perplexity guard's measure?

    .venv/bin/python tools/perplexity.py [--models NAME,...] [--formats auto,int8,q4]
        [--kv-cache-dtypes float16,float32] [--source-tokens N] [--against-llama-cpp]

The guard (tests/test_real_models.py) asks the native target's perplexity on its fixed text to stay within 3 %
of the fp32 model's (which computes with the GGUF file's dequantized weights). This prints that perplexity for
each model (default: the default target and draft) in every weight format and KV cache dtype, beside fp32's, and
with --against-llama-cpp llama.cpp's on the same GGUF file and the same token ids (needs llama-cpp-python).
--source-tokens N reads instead the first N tokens of this Python's standard-library source (the bench's long
contexts), where the cache's precision counts over many positions.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from quickdraft.bench.llama_cpp import all_logits
from quickdraft.bench.long_context import source_lines
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_tokenizer, resolve_model
from quickdraft.models.convert import gguf_source
from quickdraft.models.loading import load_hf_model
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from test_real_models import GUARD_TEXT, perplexity


def llama_cpp_perplexity(gguf: Path, token_ids: torch.Tensor) -> float:
    """llama.cpp's perplexity of ``token_ids [1, T]`` (all logits of one evaluation)."""
    logits = all_logits(gguf, token_ids[0].tolist(), len(os.sched_getaffinity(0)))  # [T, V]
    return perplexity(torch.from_numpy(logits)[None], token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=f"{DEFAULT_TARGET},{DEFAULT_DRAFT}")
    parser.add_argument("--formats", default="auto,int8,q4")
    parser.add_argument("--kv-cache-dtypes", default="float16,float32")
    parser.add_argument("--source-tokens", type=int, default=None)
    parser.add_argument("--against-llama-cpp", action="store_true")
    args = parser.parse_args()
    for name in args.models.split(","):
        path = resolve_model(name)
        text = GUARD_TEXT if args.source_tokens is None else "".join(source_lines())
        token_ids = torch.tensor([load_tokenizer(path)(text).input_ids[: args.source_tokens]])  # [1, T]

        with torch.no_grad():
            reference = perplexity(load_hf_model(path)(token_ids).logits, token_ids)
        line = f"{name} ({token_ids.shape[1]} tokens): transformers fp32 {reference:.3f}"
        if args.against_llama_cpp and (gguf := gguf_source(path)) is not None:
            peer = llama_cpp_perplexity(gguf, token_ids)
            line += f", llama.cpp {peer:.3f} ({100 * (peer / reference - 1):+.1f} %)"
        for weights in args.formats.split(","):
            for kv in args.kv_cache_dtypes.split(","):
                runtime = NativeRuntime.load(path, LoadOptions(weights, kv_cache_dtype=kv))
                native = perplexity(runtime.forward(token_ids, runtime.new_cache()), token_ids)
                line += f", native {weights} kv {kv} {native:.3f} ({100 * (native / reference - 1):+.1f} %)"
        print(line, flush=True)


if __name__ == "__main__":
    main()

"""How far is each native weight format from the transformers fp32 model, by the perplexity guard's measure?

    .venv/bin/python tools/perplexity.py [--formats auto,int8,q4]

The guard (tests/test_real_models.py) asks the native target's perplexity on its fixed text to stay within 3 %
of the fp32 model's (which computes with the GGUF file's dequantized weights). This prints that perplexity for
the default target and draft model in every weight format, beside fp32's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_tokenizer, resolve_model
from quickdraft.models.loading import load_hf_model
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from test_real_models import PROMPTS, perplexity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="auto,int8,q4")
    args = parser.parse_args()
    text = PROMPTS["summarization"] + "\n\n" + PROMPTS["code-edit"]
    for name in (DEFAULT_TARGET, DEFAULT_DRAFT):
        path = resolve_model(name)
        token_ids = torch.tensor([load_tokenizer(path)(text).input_ids])  # [1, T]

        with torch.no_grad():
            reference = perplexity(load_hf_model(path)(token_ids).logits, token_ids)
        line = f"{name} ({token_ids.shape[1]} tokens): transformers fp32 {reference:.3f}"
        for weights in args.formats.split(","):
            runtime = NativeRuntime.load(path, LoadOptions(weights))
            native = perplexity(runtime.forward(token_ids, runtime.new_cache()), token_ids)
            line += f", native {weights} {native:.3f} ({100 * (native / reference - 1):+.1f} %)"
        print(line, flush=True)


if __name__ == "__main__":
    main()

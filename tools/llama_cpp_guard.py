"""llama.cpp's own outputs on the perplexity guard's text, recorded for ``tests/test_llama_cpp_guard.py``, which
compares the native runtime with them in CI (where llama-cpp-python is not installed).

For each model (default: the default pair and Gemma-3-270m), read the guard text's token ids in one evaluation of
the model's GGUF file by llama.cpp (llama-cpp-python) and record: the file's sha256 (from the catalog, which pins
it), llama.cpp's perplexity, its greedy choice at every position (teacher-forced: the text's own tokens are read,
so each position's choice is independent of the others), and its near ties (top two logits within 1 % of the
logit range), where two runtimes' rounding may pick either.

    .venv/bin/python tools/llama_cpp_guard.py [--models NAME,...] [--out tests/data/llama_cpp_guard.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from quickdraft.bench.llama_cpp import all_logits
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, load_tokenizer, resolve_model
from quickdraft.models.convert import gguf_source

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from test_llama_cpp_guard import NEAR_TIE, choices
from test_real_models import GUARD_TEXT, perplexity


def record(name: str) -> dict:
    path = resolve_model(name)
    token_ids = load_tokenizer(path)(GUARD_TEXT).input_ids
    logits = torch.from_numpy(all_logits(gguf_source(path), token_ids, len(os.sched_getaffinity(0))))  # [T, V]
    greedy, near_tie = choices(logits)
    import llama_cpp

    return {
        "sha256": KNOWN_MODELS[name].sha256,
        "llama_cpp_python": llama_cpp.__version__,
        "token_ids": token_ids,
        "perplexity": perplexity(logits[None], torch.tensor([token_ids])),
        "greedy": greedy.tolist(),
        "near_tie": near_tie.tolist(),
        "near_tie_rule": f"top two logits within {NEAR_TIE:.0%} of the logit range",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=f"{DEFAULT_TARGET},{DEFAULT_DRAFT},gemma-3-270m")
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "tests/data/llama_cpp_guard.json")
    args = parser.parse_args()
    recorded = {name: record(name) for name in args.models.split(",")}
    args.out.write_text(json.dumps(recorded, indent=1) + "\n")
    for name, entry in recorded.items():
        print(f"{name}: llama.cpp perplexity {entry['perplexity']:.3f} on {len(entry['token_ids'])} tokens")


if __name__ == "__main__":
    main()

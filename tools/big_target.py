"""A random-weight Q4_K_M GGUF of a released shape, made the way a user's file is made: transformers saves the model,
llama.cpp's converter writes F16 GGUF, llama.cpp's quantizer writes Q4_K_M (needs llama-cpp-python).

    .venv/bin/python tools/big_target.py --shape qwen2.5-7b --out /tmp/big   # prints the .gguf path

Speed needs no trained weights: `quickdraft profile --model FILE` gives the cost curve and `quickdraft bench
--target FILE --methods baseline,llama-cpp` our plain decoding beside llama.cpp's. The vocabulary is the default
pair's (its tokenizer is what the converter reads), so a shape with another vocabulary is that body with this one.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from quickdraft.bench.llama_tools import llama_converter
from quickdraft.models import DEFAULT_DRAFT, resolve_model

SHAPES = {  # released models' shapes (Qwen2.5's vocabulary for all)
    "qwen2.5-3b": dict(model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=151936, tie_word_embeddings=True),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=151936, tie_word_embeddings=False),
}  # fmt: skip
Q4_K_M = 15  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--via",
        choices=("f16", "q8_0"),
        default="f16",
        help="the converter's output, which the quantizer reads: q8_0 needs half f16's disk (an "
        "8B shape peaks at 25 GB instead of 32) and gives a file of the same types and speed",
    )
    args = parser.parse_args()
    import llama_cpp
    from transformers import AutoConfig, AutoModelForCausalLM

    target = args.out / f"{args.shape}-random-Q4_K_M.gguf"
    if target.is_file():
        print(target)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    fields = dict(SHAPES[args.shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    hf_dir = args.out / f"{args.shape}-hf"
    model.save_pretrained(hf_dir)
    del model
    tokenizer_dir = resolve_model(DEFAULT_DRAFT)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, hf_dir / name)
    f16 = args.out / f"{args.shape}-random-{args.via.upper()}.gguf"
    converter = llama_converter()
    command = [sys.executable, str(converter), str(hf_dir), "--outfile", str(f16), "--outtype", args.via]
    subprocess.run(command, check=True, cwd=converter.parent)
    shutil.rmtree(hf_dir)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = Q4_K_M
    params.nthread = 0
    params.allow_requantize = args.via != "f16"
    status = llama_cpp.llama_model_quantize(str(f16).encode(), str(target).encode(), params)
    if status != 0:
        raise SystemExit(f"llama.cpp's quantizer failed ({status})")
    f16.unlink()
    print(f"made in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(target)


if __name__ == "__main__":
    main()

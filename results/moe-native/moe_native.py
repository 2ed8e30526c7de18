"""A Qwen3-MoE of Qwen3-30B-A3B's layer shape on the native runtime beside llama.cpp, random weights.

Writes a GGUF file with ``--layers`` of Qwen3-30B-A3B's 48 layers (hidden 2048, 32 query heads and 4 key-value
heads of 128, 128 experts of 768, 8 a token; its vocabulary of 151,936 and LM head): Q4_K everywhere (random blocks
with small positive scales), Q6_K LM head, float32 norms and router. Then, taking turns in one process, at
``--context`` cached tokens:
- ours: the forward of k new tokens (k in ``--ks``), median of ``--repeats``, the cache rolled back after each;
- llama.cpp (llama-cpp-python, its own CPU kernels, the same file): one token at a time, median of the same count.
Cost curves do not depend on trained values; the router's random weights give each token its own experts, so a block
of k tokens touches more experts than a trained model's neighbouring tokens might (docs/benchmarks.md, "Mixtures of
experts").

    python results/moe-native/moe_native.py --layers 6 --out results/moe-native/epyc-avx2.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, EXPERT_WIDTH, VOCAB = 2048, 32, 4, 128, 128, 8, 768, 151936
BLOCK = {"Q4_K": (256, 144, slice(0, 4)), "Q6_K": (256, 210, slice(208, 210))}  # weights, bytes, float16 scales


def blocks(generator: np.random.Generator, kind: str, rows: int, width: int) -> np.ndarray:
    """Random blocks of ``kind`` for ``[rows, width]``, their float16 scales small and positive."""
    weights, size, scales = BLOCK[kind]
    data = generator.integers(0, 256, size=(rows, width // weights, size), dtype=np.uint8)
    count = len(range(*scales.indices(size))) // 2
    data[..., scales] = np.full((rows, width // weights, count), 2e-3, dtype=np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def write_gguf(path: Path, layers: int) -> None:
    import gguf

    generator = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "qwen3moe")
    for key, value in (("context_length", 4096), ("embedding_length", HIDDEN), ("feed_forward_length", 6144),
                       ("block_count", layers), ("attention.head_count", HEADS), ("attention.head_count_kv", KV_HEADS),
                       ("attention.key_length", HEAD_DIM), ("attention.value_length", HEAD_DIM),
                       ("expert_count", EXPERTS), ("expert_used_count", TOP_K),
                       ("expert_feed_forward_length", EXPERT_WIDTH)):  # fmt: skip
        writer.add_uint32(f"qwen3moe.{key}", value)
    writer.add_float32("qwen3moe.rope.freq_base", 1e6)
    writer.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(["t", "0", *(f"t{i}" for i in range(VOCAB - 2))])  # "t 0" merges into "t0"
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges(["t 0"])
    writer.add_eos_token_id(VOCAB - 1)
    quantized = gguf.GGMLQuantizationType

    def add(name: str, data: np.ndarray, kind: str | None = None) -> None:
        writer.add_tensor(name, data, raw_dtype=quantized[kind] if kind else None)

    add("token_embd.weight", blocks(generator, "Q4_K", VOCAB, HIDDEN), "Q4_K")
    add("output.weight", blocks(generator, "Q6_K", VOCAB, HIDDEN), "Q6_K")
    add("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for layer in range(layers):
        prefix = f"blk.{layer}."
        for norm, width in (("attn_norm", HIDDEN), ("ffn_norm", HIDDEN), ("attn_q_norm", HEAD_DIM),
                            ("attn_k_norm", HEAD_DIM)):  # fmt: skip
            add(f"{prefix}{norm}.weight", np.ones(width, dtype=np.float32))
        attention = (("attn_q", HEADS * HEAD_DIM, HIDDEN), ("attn_k", KV_HEADS * HEAD_DIM, HIDDEN),
                     ("attn_v", KV_HEADS * HEAD_DIM, HIDDEN), ("attn_output", HIDDEN, HEADS * HEAD_DIM))  # fmt: skip
        for name, rows, width in attention:
            add(f"{prefix}{name}.weight", blocks(generator, "Q4_K", rows, width), "Q4_K")
        add(f"{prefix}ffn_gate_inp.weight", generator.normal(0, 0.5, (EXPERTS, HIDDEN)).astype(np.float32))
        for name, rows, width in (("ffn_gate_exps", EXPERT_WIDTH, HIDDEN), ("ffn_up_exps", EXPERT_WIDTH, HIDDEN),
                                  ("ffn_down_exps", HIDDEN, EXPERT_WIDTH)):  # fmt: skip
            data = blocks(generator, "Q4_K", EXPERTS * rows, width).reshape(EXPERTS, rows, -1)
            add(f"{prefix}{name}.weight", data, "Q4_K")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--ks", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2, help="turns of ours and llama.cpp's")
    parser.add_argument("--work", type=Path, default=Path("/tmp/moe-native"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from llama_cpp import Llama

    from quickdraft.models.loading import resolve_model
    from quickdraft.runtime.native import NativeRuntime
    from quickdraft.runtime.native.kernels import native_kernels

    args.work.mkdir(parents=True, exist_ok=True)
    gguf_path = args.work / f"qwen3moe-{args.layers}layers.gguf"
    if not gguf_path.is_file():
        write_gguf(gguf_path, args.layers)
    torch.set_num_threads(2)
    runtime = NativeRuntime.load(resolve_model(gguf_path, progress=False), capacity=args.context + 64)
    llama = Llama(model_path=str(gguf_path), n_ctx=args.context + 64, n_threads=2, n_batch=512, verbose=False)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB - 1, (args.context,), generator=generator)
    cache = runtime.new_cache()
    runtime.forward(prompt[None], cache, last_only=True)
    llama.eval(prompt.tolist())
    ks = [int(k) for k in args.ks.split(",")]
    rounds = []
    for _ in range(args.rounds):
        ours = {}
        for k in ks:
            times = []
            for _ in range(args.repeats):
                tokens = torch.randint(0, VOCAB - 1, (1, k), generator=generator)
                start = time.perf_counter()
                runtime.forward(tokens, cache)
                times.append(time.perf_counter() - start)
                cache.truncate(args.context)
            ours[k] = statistics.median(times) * 1000
        times = []
        for _ in range(args.repeats):  # llama.cpp decoding one token at a time, as its plain decoding does
            start = time.perf_counter()
            llama.eval([int(torch.randint(0, VOCAB - 1, (1,), generator=generator))])
            times.append(time.perf_counter() - start)
        rounds.append({"ours_ms": ours, "llama_cpp_t1_ms": statistics.median(times) * 1000})
        print(json.dumps(rounds[-1]), flush=True)
    record = {
        "command": f"python results/moe-native/moe_native.py --layers {args.layers} --context {args.context} "
        f"--ks {args.ks} --repeats {args.repeats} --rounds {args.rounds}",
        "machine": platform.processor() or platform.machine(),
        "kernels": native_kernels().isa(),
        "layers": args.layers,
        "rounds": rounds,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()

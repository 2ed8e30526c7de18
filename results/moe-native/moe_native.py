"""A mixture of experts of a released model's layer shape on the native runtime beside llama.cpp, random weights.

Writes a GGUF file with ``--layers`` of ``--model``'s layers at their real shape (hidden 2048 and, but for OLMoE's, the
vocabulary of 151,936 with its LM head in both):
- ``qwen3-30b-a3b`` (48 layers): 32 query heads and 4 key-value heads of 128 with q/k norms, 128 experts of 768, 8 a
  token;
- ``qwen1.5-moe-a2.7b`` (24 layers; Qwen2-MoE): 16 heads of 128 with q/k/v biases, 60 experts of 1408, 4 a token,
  and a shared expert of 5632 every token takes. 1408 is not a multiple of Q4_K's 256, so its experts' down
  projections are Q8_0.
- ``olmoe-1b-7b`` (16 layers: the whole model; vocabulary 50,304): 16 heads of 128 with OLMo's q/k norms across all
  heads, 64 experts of 1024 (the file's ``feed_forward_length``, as llama.cpp's converter writes it), 8 a token.
Q4_K everywhere else (random blocks with small positive scales; without q/k norms, the q and k projections' smaller,
``QK_SCALE``), Q6_K LM head, float32 norms, biases, router and shared gate. Then, taking turns in one
process, at ``--context`` cached tokens:
- ours: the forward of k new tokens (k in ``--ks``), median of ``--repeats``, the cache rolled back after each;
- llama.cpp (llama-cpp-python, its own CPU kernels, the same file): one token at a time, median of the same count.
Cost curves do not depend on trained values, but for how far the attention scores spread; the router's random
weights give each token its own experts, so a block of k tokens touches more experts than a trained model's
neighbouring tokens might (docs/benchmarks.md, "Mixtures of experts").

    python results/moe-native/moe_native.py --layers 6 --out results/moe-native/xeon-avx512-6layers.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

HIDDEN, HEAD_DIM, VOCAB = 2048, 128, 151936
BLOCK_SCALE = 2e-3  # every quantized block's float16 scales, but for QK_SCALE's
# Without q/k norms, the q and k projections' block scales: a row's attention scores then spread
# over about 8 as a trained model's do (median max - min over 256 random tokens at layer 0), not over thousands, where
# most softmax weights are subnormal floats
QK_SCALE = 6e-6
# weights a block, bytes a block, the float16 scales' bytes
BLOCK = {"Q4_K": (256, 144, slice(0, 4)), "Q6_K": (256, 210, slice(208, 210)), "Q8_0": (32, 34, slice(0, 2))}


@dataclass(frozen=True)
class Shape:
    architecture: str  # general.architecture
    heads: int
    kv_heads: int
    experts: int
    top_k: int
    expert_width: int
    shared_width: int = 0  # the shared expert's (0: none)
    qk_norm: bool = False
    qk_norm_all_heads: bool = False  # OLMo's: q's norm as wide as all q heads, k's as all k heads
    attention_bias: bool = False
    down_type: str = "Q4_K"  # the experts' down projections'
    vocab: int = VOCAB
    expert_width_key: str = "expert_feed_forward_length"  # the key stating an expert's width


SHAPES = {
    "qwen3-30b-a3b": Shape("qwen3moe", 32, 4, 128, 8, 768, qk_norm=True),
    "qwen1.5-moe-a2.7b": Shape("qwen2moe", 16, 16, 60, 4, 1408, shared_width=5632, attention_bias=True,
                               down_type="Q8_0"),
    "olmoe-1b-7b": Shape("olmoe", 16, 16, 64, 8, 1024, qk_norm=True, qk_norm_all_heads=True, vocab=50304,
                         expert_width_key="feed_forward_length"),
}  # fmt: skip


def blocks(generator: np.random.Generator, kind: str, rows: int, width: int, scale: float = BLOCK_SCALE) -> np.ndarray:
    """Random blocks of ``kind`` for ``[rows, width]``, their float16 scales small and positive (``scale``)."""
    weights, size, scales = BLOCK[kind]
    data = generator.integers(0, 256, size=(rows, width // weights, size), dtype=np.uint8)
    count = len(range(*scales.indices(size))) // 2
    data[..., scales] = np.full((rows, width // weights, count), scale, dtype=np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def write_gguf(path: Path, shape: Shape, layers: int) -> None:
    import gguf

    generator = np.random.default_rng(0)
    arch = shape.architecture
    writer = gguf.GGUFWriter(path, arch)
    keys = {"context_length": 4096, "embedding_length": HIDDEN, "feed_forward_length": 6144, "block_count": layers,
            "attention.head_count": shape.heads, "attention.head_count_kv": shape.kv_heads,
            "attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM, "expert_count": shape.experts,
            "expert_used_count": shape.top_k}  # fmt: skip
    keys[shape.expert_width_key] = shape.expert_width  # OLMoE's replaces the dense width
    if shape.shared_width:
        keys["expert_shared_feed_forward_length"] = shape.shared_width
    for key, value in keys.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", 1e6)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(["t", "0", *(f"t{i}" for i in range(shape.vocab - 2))])  # "t 0" merges into "t0"
    writer.add_token_types([1] * shape.vocab)
    writer.add_token_merges(["t 0"])
    writer.add_eos_token_id(shape.vocab - 1)
    quantized = gguf.GGMLQuantizationType

    def add(name: str, data: np.ndarray, kind: str | None = None) -> None:
        writer.add_tensor(name, data, raw_dtype=quantized[kind] if kind else None)

    def floats(*size: int) -> np.ndarray:
        return generator.normal(0, 0.5, size).astype(np.float32)

    add("token_embd.weight", blocks(generator, "Q4_K", shape.vocab, HIDDEN), "Q4_K")
    add("output.weight", blocks(generator, "Q6_K", shape.vocab, HIDDEN), "Q6_K")
    add("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    q_rows, kv_rows = shape.heads * HEAD_DIM, shape.kv_heads * HEAD_DIM
    for layer in range(layers):
        prefix = f"blk.{layer}."
        norms = [("attn_norm", HIDDEN), ("ffn_norm", HIDDEN)]
        q_norm, k_norm = (q_rows, kv_rows) if shape.qk_norm_all_heads else (HEAD_DIM, HEAD_DIM)
        norms += [("attn_q_norm", q_norm), ("attn_k_norm", k_norm)] if shape.qk_norm else []
        for norm, width in norms:
            add(f"{prefix}{norm}.weight", np.ones(width, dtype=np.float32))
        attention = (("attn_q", q_rows, HIDDEN), ("attn_k", kv_rows, HIDDEN), ("attn_v", kv_rows, HIDDEN),
                     ("attn_output", HIDDEN, q_rows))  # fmt: skip
        for name, rows, width in attention:
            scale = QK_SCALE if name in ("attn_q", "attn_k") and not shape.qk_norm else BLOCK_SCALE
            add(f"{prefix}{name}.weight", blocks(generator, "Q4_K", rows, width, scale), "Q4_K")
            if shape.attention_bias and name != "attn_output":
                add(f"{prefix}{name}.bias", floats(rows))
        add(f"{prefix}ffn_gate_inp.weight", floats(shape.experts, HIDDEN))
        width = shape.expert_width
        experts = (("ffn_gate_exps", width, HIDDEN, "Q4_K"), ("ffn_up_exps", width, HIDDEN, "Q4_K"),
                   ("ffn_down_exps", HIDDEN, width, shape.down_type))  # fmt: skip
        for name, rows, columns, kind in experts:
            data = blocks(generator, kind, shape.experts * rows, columns).reshape(shape.experts, rows, -1)
            add(f"{prefix}{name}.weight", data, kind)
        if shape.shared_width:
            add(f"{prefix}ffn_gate_inp_shexp.weight", floats(HIDDEN))
            for name, rows, columns in (("ffn_gate_shexp", shape.shared_width, HIDDEN),
                                        ("ffn_up_shexp", shape.shared_width, HIDDEN),
                                        ("ffn_down_shexp", HIDDEN, shape.shared_width)):  # fmt: skip
                add(f"{prefix}{name}.weight", blocks(generator, "Q4_K", rows, columns), "Q4_K")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=SHAPES, default="qwen3-30b-a3b", help="whose layer shape")
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
    from quickdraft.runtime.base import LoadOptions
    from quickdraft.runtime.native import NativeRuntime
    from quickdraft.runtime.native.kernels import native_kernels

    args.work.mkdir(parents=True, exist_ok=True)
    gguf_path = args.work / f"{args.model}-{args.layers}layers.gguf"
    if not gguf_path.is_file():
        write_gguf(gguf_path, SHAPES[args.model], args.layers)
    torch.set_num_threads(2)
    runtime = NativeRuntime.load(resolve_model(gguf_path, progress=False), LoadOptions(max_context=args.context + 64))
    llama = Llama(model_path=str(gguf_path), n_ctx=args.context + 64, n_threads=2, n_batch=512, verbose=False)
    generator = torch.Generator().manual_seed(0)
    vocab = SHAPES[args.model].vocab
    prompt = torch.randint(0, vocab - 1, (args.context,), generator=generator)
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
                tokens = torch.randint(0, vocab - 1, (1, k), generator=generator)
                start = time.perf_counter()
                runtime.forward(tokens, cache)
                times.append(time.perf_counter() - start)
                cache.truncate(args.context)
            ours[k] = statistics.median(times) * 1000
        times = []
        for _ in range(args.repeats):  # llama.cpp decoding one token at a time, as its plain decoding does
            start = time.perf_counter()
            llama.eval([int(torch.randint(0, vocab - 1, (1,), generator=generator))])
            times.append(time.perf_counter() - start)
        rounds.append({"ours_ms": ours, "llama_cpp_t1_ms": statistics.median(times) * 1000})
        print(json.dumps(rounds[-1]), flush=True)
    record = {
        "command": f"python results/moe-native/moe_native.py --model {args.model} --layers {args.layers} "
        f"--context {args.context} "
        f"--ks {args.ks} --repeats {args.repeats} --rounds {args.rounds}",
        "machine": platform.processor() or platform.machine(),
        "kernels": native_kernels().isa(),
        "model": args.model,
        "layers": args.layers,
        "rounds": rounds,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()

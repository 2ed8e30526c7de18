"""Is the native runtime still well ahead of the transformers runtime on every family it runs?

    .venv/bin/python tools/family_speed.py [--families qwen3,llama3,gemma3,smollm3,phi3,mistral] [--layers N] [--json F]

For each family a random-weight model of a real released shape (the shapes below; --layers cuts the layer count to
save memory and time, the per-layer cost is what differs between runtimes) is saved by transformers, loaded by both
runtimes (native: int8 weights quantized from the float ones), and one decoding step after a 128-token context is
timed on each, the two taking turns, fastest of 5. Prints t(1) per runtime and their ratio; trained weights are not
needed for timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from quickdraft.runtime import HFRuntime
from quickdraft.runtime.base import LoadOptions
from quickdraft.runtime.native import NativeRuntime

SHAPES = {  # released models' shapes: (transformers config class, its fields)
    "qwen3": ("Qwen3Config", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                  tie_word_embeddings=True)),  # Qwen3-0.6B
    "llama3": ("LlamaConfig", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                   tie_word_embeddings=True, rope_parameters={
                                       "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})),  # Llama-3.2-1B
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                        vocab_size=262144, sliding_window=512, query_pre_attn_scalar=256)),  # 1B
    "smollm3": ("SmolLM3Config", dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                                      num_attention_heads=16, num_key_value_heads=4, vocab_size=128256)),  # 3B
    "phi3": ("Phi3Config", dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=32, vocab_size=32064)),  # Phi-3-mini
    "mistral": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
                                      sliding_window=4096)),  # Mistral-7B
}  # fmt: skip


def step_ms(runtime, context: torch.Tensor) -> float:
    """One decoding step after ``context`` (rolled back after each run), in milliseconds."""
    cache = runtime.new_cache()
    runtime.forward(context, cache)
    length = context.shape[1]
    started = time.perf_counter()
    runtime.forward(torch.tensor([[7]]), cache)
    elapsed = time.perf_counter() - started
    cache.truncate(length)
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(SHAPES))
    parser.add_argument("--layers", type=int, default=4, help="layers to keep of each shape (0: all)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    import transformers

    results = []
    context = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(0))
    for family in args.families.split(","):
        class_name, fields = SHAPES[family]
        fields = dict(fields)
        if args.layers:
            fields["num_hidden_layers"] = args.layers
        config = getattr(transformers, class_name)(**fields)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with tempfile.TemporaryDirectory() as scratch:
            model.save_pretrained(scratch)
            native = NativeRuntime.load(Path(scratch), LoadOptions(max_context=256))
        runtimes = {"native": native, "transformers": HFRuntime(model)}
        times: dict[str, list[float]] = {name: [] for name in runtimes}
        for _ in range(6):  # turns; the first is a warm-up
            for name, runtime in runtimes.items():
                times[name].append(step_ms(runtime, context))
        best = {name: min(values[1:]) for name, values in times.items()}
        ratio = best["transformers"] / best["native"]
        results.append({"family": family, "layers": fields["num_hidden_layers"], **best, "ratio": ratio})
        print(f"{family:8s} {fields['num_hidden_layers']:2d} layers: native {best['native']:7.1f} ms, "
              f"transformers {best['transformers']:7.1f} ms, {ratio:.1f}x", flush=True)  # fmt: skip
        del model, runtimes, native
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()

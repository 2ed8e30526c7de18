"""OLMo 2, OLMo 3 and OLMoE on the native runtime beside llama.cpp and transformers, on the same GGUF file and ids.

For each family a tiny random model of transformers' own class (tests/native/test_families.py's, with sharpened
logits; OLMoE without grouped KV heads, as the released model: llama.cpp's OLMoE reads k's norm as wide as the
model) is saved, converted to an F32 GGUF file by llama.cpp's converter, and read by the native runtime (7-bit
weights) and by llama.cpp (llama-cpp-python, its own CPU kernels). Prints each pair's largest logit difference over
the largest logit, and how often their argmax agree, over 24 positions; then the same for the native runtime with one
of its family's choices changed (negative controls): q and k normed per head instead of across heads, and an OLMoE's
expert weights renormalized. A control far from llama.cpp shows the comparison would see that mistake.

    python results/olmo-native/vs_llama_cpp.py > results/olmo-native/vs_llama_cpp.txt
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TESTS = Path(__file__).parents[2] / "tests"
sys.path[:0] = [str(TESTS / "native"), str(TESTS)]
from conftest import tiny_config  # noqa: E402
from test_families import FAMILIES, build  # noqa: E402

from quickdraft.bench.llama_cpp import all_logits  # noqa: E402
from quickdraft.bench.llama_tools import llama_converter  # noqa: E402
from quickdraft.models import DEFAULT_DRAFT  # noqa: E402
from quickdraft.models.loading import resolve_model  # noqa: E402
from quickdraft.runtime.base import LoadOptions  # noqa: E402
from quickdraft.runtime.native import NativeRuntime  # noqa: E402

VOCAB = 151936  # the default pair's tokenizer, which the converter knows


def olmoe(vocab: int) -> torch.nn.Module:  # test_families' OLMoE with 4 KV heads for its 4 query heads
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = tiny_config(OlmoeConfig, vocab, 2, num_experts=8, num_experts_per_tok=2)
    config.num_key_value_heads = 4
    return OlmoeForCausalLM(config)


def compare(label: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Print the largest difference of two logit tensors [T, V] over the largest logit, and argmax agreement."""
    error = float((ours - theirs).abs().max() / theirs.abs().max())
    agreement = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    print(f"  {label}: max |difference| / max |logit| {error:.4f}, argmax agreement {agreement:.3f}", flush=True)


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}; llama-cpp-python", end=" ")
    import llama_cpp

    print(llama_cpp.__version__)
    FAMILIES["olmoe"] = olmoe
    for family in ("olmo2", "olmo3", "olmoe"):
        work = Path(tempfile.mkdtemp())
        model = build(family, vocab=VOCAB, logit_scale=8.0)
        model.save_pretrained(work / "hf")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(resolve_model(DEFAULT_DRAFT, progress=False) / name, work / "hf" / name)
        converter, gguf = llama_converter(), work / f"{family}.gguf"
        command = [sys.executable, str(converter), str(work / "hf"), "--outfile", str(gguf), "--outtype", "f32"]
        subprocess.run(command, check=True, capture_output=True, cwd=converter.parent)
        ids = torch.randint(0, VOCAB - 1, (1, 24), generator=torch.Generator().manual_seed(1))
        runtime = NativeRuntime.load(resolve_model(gguf, progress=False), LoadOptions(max_context=64))
        decoder = runtime.decoder
        ours = runtime.forward(ids, runtime.new_cache())[0]  # [T, V]
        llama = torch.from_numpy(all_logits(gguf, ids[0].tolist(), 2))
        with torch.no_grad():
            reference = model(ids).logits[0]
        print(family)
        compare("llama.cpp against transformers", llama, reference)
        compare("ours against llama.cpp", ours, llama)
        compare("ours against transformers", ours, reference)
        layers, head_dim = decoder.layers, decoder.config.head_dim
        kept = [(layer.q_norm, layer.k_norm, layer.experts) for layer in layers]
        for layer in layers:  # control: OLMo's q/k norm weights applied to each head alone
            layer.q_norm, layer.k_norm = layer.q_norm[:head_dim], layer.k_norm[:head_dim]
        decoder._layers_spec = None  # the compiled layers read the changed weights
        compare("control, q/k normed per head, against llama.cpp", runtime.forward(ids, runtime.new_cache())[0], llama)
        for layer, (q_norm, k_norm, experts) in zip(layers, kept, strict=True):
            layer.q_norm, layer.k_norm = q_norm, k_norm
            if experts is not None:  # control: the experts' weights renormalized
                layer.experts = dataclasses.replace(experts, normalize=not experts.normalize)
        if kept[0][2] is not None:
            decoder._layers_spec = None
            compare("control, expert weights renormalized, against llama.cpp",
                    runtime.forward(ids, runtime.new_cache())[0], llama)  # fmt: skip
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

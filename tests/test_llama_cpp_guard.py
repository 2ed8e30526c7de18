"""The native runtime against llama.cpp on the same GGUF files: llama.cpp's perplexity and greedy choices on the
guard text, recorded by ``tools/llama_cpp_guard.py`` (llama-cpp-python is not installed in CI) for files the
catalog pins by sha256. The native runtime computes with other arithmetic (exact integer GEMMs, its own
activation quantization; docs/families.md), so its choices are held to a stated agreement, not equality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_real_models import GUARD_TEXT, perplexity

from quickdraft.models import KNOWN_MODELS, load_tokenizer, resolve_model
from quickdraft.runtime.native import NativeRuntime

pytestmark = pytest.mark.real_model

RECORDED = Path(__file__).parent / "data" / "llama_cpp_guard.json"
NEAR_TIE = 0.01  # top two logits within this share of the logit range: either runtime may pick either
# The stated agreement: greedy choices equal on this share of the positions, and of those without a near tie
AGREEMENT, CLEAR_AGREEMENT = 0.90, 0.95
# Native perplexity at most this much above llama.cpp's (issue 43's goal; the 0.5B draft stores its weights in 4
# bits by default and is held to 3 %: docs/limits.md)
PERPLEXITY_MARGIN = {"gemma-3-270m": 0.01, "qwen2.5-coder-1.5b-instruct": 0.01, "qwen2.5-coder-0.5b-instruct": 0.03}


def choices(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [T, V]`` -> (greedy token per position ``[T]``, near ties ``[T]`` bool)."""
    top_two = logits.topk(2, dim=-1).values  # [T, 2]
    spread = logits.max(dim=-1).values - logits.min(dim=-1).values  # [T]
    return logits.argmax(dim=-1), (top_two[:, 0] - top_two[:, 1]) <= NEAR_TIE * spread


@pytest.mark.parametrize("name", sorted(PERPLEXITY_MARGIN))
def test_native_agrees_with_llama_cpp_on_the_same_file(name: str) -> None:
    recorded = json.loads(RECORDED.read_text())[name]
    assert recorded["sha256"] == KNOWN_MODELS[name].sha256, "recorded on another file: rerun tools/llama_cpp_guard.py"
    path = resolve_model(name, progress=False)
    token_ids = load_tokenizer(path)(GUARD_TEXT).input_ids
    assert token_ids == recorded["token_ids"]
    runtime = NativeRuntime.load(path)
    logits = runtime.forward(torch.tensor([token_ids]), runtime.new_cache())[0]  # [T, V]
    native_greedy, _ = choices(logits)
    equal = native_greedy == torch.tensor(recorded["greedy"])  # [T]
    clear = ~torch.tensor(recorded["near_tie"])
    assert equal.float().mean() >= AGREEMENT, float(equal.float().mean())
    assert equal[clear].float().mean() >= CLEAR_AGREEMENT, float(equal[clear].float().mean())
    native = perplexity(logits[None], torch.tensor([token_ids]))
    assert native <= recorded["perplexity"] * (1 + PERPLEXITY_MARGIN[name]), (native, recorded["perplexity"])

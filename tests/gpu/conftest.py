"""Tiny random models built on a CUDA GPU from configs (no download), for the ``gpu`` tests.

Self-contained: a GPU machine may lack the server's packages, so ``tools/gpu_checks.py`` runs these tests with
``--confcutdir tests/gpu`` (the repository's tests/conftest.py is not loaded there). Without CUDA every test in
this folder skips.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from quickdraft.api import Pipeline
from quickdraft.runtime import HFRuntime

EOS = "<eos>"
VOCAB = 64


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none)")
    for item in items:
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(skip)


def word_tokenizer(vocab_size: int) -> Any:
    """Words ``w0 .. w{V-2}`` and an end-of-sequence token, split on spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size - 1)} | {EOS: vocab_size - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS)


def family_config(family: str, vocab_size: int, num_layers: int) -> Any:
    """A 64-wide config of the Qwen2 or Gemma shape (Gemma: GeGLU, (1 + w) norms, scaled embeddings, one KV
    head, head_dim 16 unlike hidden / heads)."""
    from transformers import GemmaConfig, Qwen2Config

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                  max_position_embeddings=512, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1,
                  bos_token_id=None)  # fmt: skip
    if family == "qwen2":
        return Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, **common)
    return GemmaConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=16, **common)


def cuda_model(family: str, seed: int, dtype: torch.dtype, num_layers: int = 2, logit_scale: float = 8.0) -> Any:
    """A random causal LM of ``family`` made on the GPU in ``dtype``; ``logit_scale`` sharpens its
    distributions (drafts get accepted, argmax ties are rare)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(family_config(family, VOCAB, num_layers), dtype=dtype)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    return model.eval()


def cuda_pipeline(family: str, dtype: torch.dtype, logit_scale: float = 8.0, draft_noise: float = 0.3) -> Pipeline:
    """A tiny target of ``family`` on the GPU, drafted by a copy of it whose LM head carries noise (``draft_noise``
    times the weights' scale): its drafts are accepted often, not always."""
    target = cuda_model(family, 0, dtype, 2, logit_scale)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        weight = draft.get_output_embeddings().weight
        generator = torch.Generator(device="cuda").manual_seed(1)
        weight.add_(draft_noise * weight.std() * torch.randn(weight.shape, generator=generator, device="cuda"))
    tokenizer = word_tokenizer(VOCAB)
    return Pipeline(
        target=HFRuntime(target),
        tokenizer=tokenizer,
        eos_token_ids=frozenset(),  # answers run to their budgets
        draft=HFRuntime(draft),
    )


@pytest.fixture(autouse=True)
def exact_fp32() -> Any:
    """fp32 products in fp32, not TF32, for the tests that compare bits."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before

"""The runtime interface's shared behaviour, on the transformers runtime (the native one: test_native.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import BigramTableRuntime, native_from_hf, tiny_model

from quickdraft.runtime import BatchRow, HFRuntime
from quickdraft.runtime.options import draft_load_options


def test_a_batched_forward_runs_each_request_on_its_own_cache() -> None:
    runtime = HFRuntime(tiny_model(32, seed=0))
    histories, new_tokens = [[1, 2, 3], [4, 5, 6, 7, 8], [9]], [[10, 11], [12], [13, 14, 15]]
    caches = []
    for history in histories:
        caches.append(cache := runtime.new_cache(1))
        runtime.forward(torch.tensor([history]), cache)
    rows = [
        BatchRow(cache, new, last_only=index == 2)
        for index, (cache, new) in enumerate(zip(caches, new_tokens, strict=True))
    ]
    batched = runtime.forward_batch(rows)
    for index, (history, new) in enumerate(zip(histories, new_tokens, strict=True)):
        expected = runtime.forward(torch.tensor([history + new]), runtime.new_cache(1))[0, len(history) :]
        got = batched[index]
        assert got.shape == ((1, 32) if index == 2 else (len(new), 32))
        assert torch.allclose(got, expected[-got.shape[0] :], atol=1e-5)
        assert int(caches[index].lengths[0]) == len(history) + len(new)


def test_the_transformers_runtime_refuses_load_options_it_cannot_honour(tmp_path) -> None:
    from quickdraft.errors import ConfigError
    from quickdraft.runtime import LoadOptions

    tiny_model(32, seed=0).save_pretrained(tmp_path)
    for options in (LoadOptions(weights="q4"), LoadOptions(vocabulary=(0, 1, 2))):
        with pytest.raises(ConfigError, match="needs the native runtime"):
            HFRuntime.load(tmp_path, options)
    assert HFRuntime.load(tmp_path, LoadOptions()).vocab_size == 32
    tokenizer = type("Tokenizer", (), {"__len__": lambda self: 32})()
    for weights, vocabulary, setting in (("q4", None, "draft_weights"), (None, 16, "draft_vocabulary")):
        with pytest.raises(ConfigError, match=f"^{setting} .* needs the native runtime") as refused:
            draft_load_options(HFRuntime, tokenizer, weights, vocabulary)  # what was asked, not a default
        assert refused.value.setting == setting
    assert draft_load_options(HFRuntime, tokenizer, "auto", 0) == LoadOptions()  # as stored, all of it: what it does


@pytest.mark.parametrize("kind", ["transformers", "native", "reading"])
def test_a_placeholder_context_is_as_long_as_a_read_one_and_leaves_the_text_before_it(kind: str) -> None:
    """Calibration times forwards after thousands of placeholder positions instead of reading a prompt first."""
    model = tiny_model(32, seed=0)
    runtimes = {
        "transformers": HFRuntime,
        "native": native_from_hf,
        "reading": lambda _: BigramTableRuntime.random(32, 0, 1.0),
    }
    runtime = runtimes[kind](model)
    cache = runtime.new_cache(1)
    runtime.forward(torch.tensor([[1, 2, 3, 4, 5]]), cache)
    reference = runtime.forward(torch.tensor([[6]]), cache)  # [1, 1, V] after the 5 tokens
    cache.truncate(5)
    runtime.fill_placeholder(cache, 20)  # 5..24: into the middle of the native runtime's second key block and past
    assert int(cache.lengths[0]) == 25
    assert torch.isfinite(runtime.forward(torch.tensor([[6, 7]]), cache)).all()
    cache.truncate(5)
    assert torch.equal(runtime.forward(torch.tensor([[6]]), cache), reference)
    if kind == "native":
        with pytest.raises(ValueError, match="holds"):
            runtime.fill_placeholder(cache, runtime.max_context)


def test_a_draft_vocabulary_larger_than_the_drafts_is_refused() -> None:
    from conftest import word_tokenizer

    from quickdraft.errors import ConfigError
    from quickdraft.runtime.native import NativeRuntime
    from quickdraft.runtime.options import draft_load_options

    tokenizer = word_tokenizer(32)
    assert draft_load_options(NativeRuntime, tokenizer, None, len(tokenizer)).vocabulary is not None
    assert draft_load_options(NativeRuntime, tokenizer, None, None).vocabulary is not None  # the default: all it has
    with pytest.raises(
        ConfigError, match=f"draft_vocabulary 99999999 is larger than the draft model's vocabulary of {len(tokenizer)}"
    ):
        draft_load_options(NativeRuntime, tokenizer, None, 99999999)


def test_a_multimodal_models_context_is_its_text_models() -> None:
    """Gemma 3's multimodal checkpoints load as Gemma3ForConditionalGeneration, whose own config has no positions."""
    from transformers import AutoModelForCausalLM, Gemma3Config

    text = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=8192, sliding_window=8)  # fmt: skip
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)  # fmt: skip
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299,
                          boi_token_index=297, eoi_token_index=298)  # fmt: skip
    runtime = HFRuntime(AutoModelForCausalLM.from_config(config))
    assert runtime.max_context == 8192  # was 2048
    assert runtime.kv_bytes_per_token == 2 * 1 * 2 * 8 * 4  # keys and values, 1 layer, 2 heads of 8, float32

"""The native runtime's weights: quantized once per model and format, cached, the formats a caller asks for."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import quickdraft.runtime.native.weights as weights
from quickdraft.errors import ConfigError, ModelFilesError
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.parts import quantize_weight


def test_load_caches_the_quantized_weights(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    model_dir = tmp_path / "tiny"
    tiny_model(64, seed=3).save_pretrained(model_dir)
    assert NativeRuntime.supports(model_dir)
    first = NativeRuntime.load(model_dir)
    assert (weights.native_cache_dir(model_dir) / "weights.safetensors").is_file()

    def no_quantizing(*args, **kwargs):
        raise AssertionError("the cached weights should be used")

    monkeypatch.setattr(weights, "quantize_state_dict", no_quantizing)
    second = NativeRuntime.load(model_dir)
    tokens = torch.tensor([[1, 5, 9, 13]])
    assert torch.equal(first.forward(tokens, first.new_cache()), second.forward(tokens, second.new_cache()))


def test_load_errors_are_clear(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    model_dir = tmp_path / "tiny"
    tiny_model(64, seed=3).save_pretrained(model_dir)
    (model_dir / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFilesError, match="cannot load the weights"):
        NativeRuntime.load(model_dir)
    config = model_dir / "config.json"
    config.write_text(config.read_text().replace('"qwen2"', '"gpt2"'))
    assert not NativeRuntime.supports(model_dir)
    with pytest.raises(ModelFilesError, match=r"; the transformers runtime may$"):
        NativeRuntime.load(model_dir)


def test_weight_formats(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 everywhere, or q4 wherever the input width allows it (the tiny model's 32-wide inputs do not; its
    64-wide down projection does); an unknown format is refused before anything is read."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    model_dir = tmp_path / "tiny"
    tiny_model(64, seed=3).save_pretrained(model_dir)
    kinds, builds = {}, set()
    for fmt in ("int8", "q4", "auto"):
        runtime = NativeRuntime.load(model_dir, LoadOptions(weights=fmt))
        layer = runtime.decoder.layers[0]
        kinds[fmt] = [part.kind for linear in (layer.qkv, layer.down) for part in linear.parts]
        builds.add(runtime.build)  # measured costs and learned acceptance are keyed by it
    assert kinds == {"int8": ["int8", "int8"], "q4": ["int8", "q4"], "auto": ["int8", "int8"]}
    assert len(builds) == 3
    assert len({weights.native_cache_dir(model_dir, fmt) for fmt in ("int8", "q4", "auto")}) == 3
    with pytest.raises(ConfigError, match="unknown weight format 'q3'"):
        NativeRuntime.load(model_dir, LoadOptions(weights="q3"))


def test_tied_embeddings_share_the_lm_head_weights() -> None:
    model = tiny_model(64, seed=3)
    config = DecoderConfig.from_hf(model.config.to_dict() | {"tie_word_embeddings": True})
    tensors = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    del tensors["lm_head.weight"]
    state = weights.quantize_state_dict(config, tensors)
    assert torch.equal(state["lm_head.0.int8.scale"][:64], quantize_weight(state["embedding"])[1])


def test_a_vocabulary_subset_keeps_those_logits_bitwise_and_rules_out_the_rest(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    model_dir = tmp_path / "tiny"
    tiny_model(64, seed=3).save_pretrained(model_dir)
    full = NativeRuntime.load(model_dir)
    kept = (0, 1, 2, 5, 17, 40, 63)
    subset = NativeRuntime.load(model_dir, LoadOptions(vocabulary=kept))
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    expected = full.forward(tokens, full.new_cache())  # [1, 6, 64]
    got = subset.forward(tokens, subset.new_cache())
    assert got.shape == expected.shape and subset.vocab_size == 64
    assert torch.equal(got[..., list(kept)], expected[..., list(kept)])
    others = [token for token in range(64) if token not in kept]
    assert bool((got[..., others] == -torch.inf).all())
    for bad in ((), (64,), (-1, 3)):  # nothing the model can produce, or a negative id
        with pytest.raises(ConfigError, match=r"token ids in 0\.\.63"):
            NativeRuntime.load(model_dir, LoadOptions(vocabulary=bad))


def test_a_focus_adds_tokens_to_a_vocabulary_subset_bitwise(tmp_path, monkeypatch) -> None:
    """A request's prompt tokens beside the frequent ones: their logits are the whole LM head's, bit for bit; a
    new focus replaces the old one; a runtime that computes every token ignores it."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    model_dir = tmp_path / "tiny"
    tiny_model(64, seed=3).save_pretrained(model_dir)
    full = NativeRuntime.load(model_dir)
    kept = (0, 1, 2, 5)
    subset = NativeRuntime.load(model_dir, LoadOptions(vocabulary=kept))
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    expected = full.forward(tokens, full.new_cache())  # [1, 6, 64]
    for focus in ([42, 8, 1, 8, 63], [20], []):
        subset.focus_vocabulary(focus)
        got = subset.forward(tokens, subset.new_cache())
        computed = sorted(set(kept) | set(focus))
        assert torch.equal(got[..., computed], expected[..., computed])
        others = [token for token in range(64) if token not in computed]
        assert bool((got[..., others] == -torch.inf).all())
    full.focus_vocabulary([3])
    assert torch.equal(full.forward(tokens, full.new_cache()), expected)

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


def test_prune_deletes_only_packed_weights_no_load_reads(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Kept: a model in the cache (in any format) and a directory outside it that its entry's note names. Deleted:
    an entry without a note (an older version's), one whose note names a removed model, one of an older format."""
    import json
    import shutil

    from quickdraft.cli import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(cache))
    inside, outside, removed = cache / "models" / "tiny" / "hf", tmp_path / "outside", tmp_path / "removed"
    for seed, directory in enumerate((inside, outside, removed)):
        tiny_model(64, seed=seed).save_pretrained(directory)
        NativeRuntime.load(directory, LoadOptions("int8" if directory is inside else "auto"))
    shutil.rmtree(removed)
    native = cache / "native"
    noteless = native / "0123456789abcdef"
    noteless.mkdir()
    (noteless / "weights.safetensors").write_bytes(b"x" * 10)
    older = native / "fedcba9876543210"
    older.mkdir()
    (older / weights.ENTRY_SOURCE).write_text(
        json.dumps({"format": "parts-v1", "weights": "auto", "model": str(outside)})
    )
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no-builds"))  # the kernels loaded: prune none of theirs
    kept = {weights.native_cache_dir(inside, "int8"), weights.native_cache_dir(outside)}
    stale = set(weights.stale_native_entries())
    assert stale == set(native.iterdir()) - kept and len(stale) == 3  # removed's, the noteless and the older one
    assert main(["cache", "--prune", "--json"]) == 0
    assert {row["path"] for row in json.loads(capsys.readouterr().out)} == {str(path) for path in stale}
    assert set(native.iterdir()) == kept
    assert main(["cache", "--prune"]) == 0 and "freed 0 B: 0 stale packed weights" in capsys.readouterr().out
    (weights.native_cache_dir(outside) / weights.ENTRY_SOURCE).unlink()  # as packed before notes: written on a load
    NativeRuntime.load(outside)
    assert weights.stale_native_entries() == []


def test_prune_says_which_entries_it_could_not_delete(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """An entry rmtree cannot delete is reported with why, counts only the bytes that went, and fails the command."""
    import json
    import shutil

    from quickdraft.cli import main

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no-builds"))
    stale = tmp_path / "cache" / "native" / "0123456789abcdef"
    stale.mkdir(parents=True)
    (stale / "weights.safetensors").write_bytes(b"x" * 10)
    real_rmtree = shutil.rmtree

    def refuse(path, ignore_errors=False, onerror=None):
        onerror(real_rmtree, str(path), (PermissionError, PermissionError(13, "Permission denied"), None))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    assert main(["cache", "--prune", "--json"]) == 1
    out, err = capsys.readouterr()
    (row,) = json.loads(out)
    assert row["bytes"] == 0 and "Permission denied" in row["error"] and stale.exists()
    assert "1 stale entries could not be deleted" in err
    assert main(["cache", "--prune"]) == 1
    out = capsys.readouterr().out
    assert "not deleted: " in out and "freed 0 B: 0 stale packed weights" in out  # counts what went, not what was met
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    stray = tmp_path / "cache" / "native" / "stray.txt"  # a file where an entry would be: deleted as one
    stray.write_bytes(b"y" * 5)
    assert main(["cache", "--prune"]) == 0 and not stray.exists() and not stale.exists()
    assert "freed 15 B: 2 stale packed weights" in capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere"  # a link to a directory: the link goes; what it points at stays, uncounted
    elsewhere.mkdir()
    (elsewhere / "kept.bin").write_bytes(b"z" * 7)
    (tmp_path / "cache" / "native" / "linked").symlink_to(elsewhere)
    assert main(["cache", "--prune"]) == 0 and (elsewhere / "kept.bin").exists()
    assert "freed 0 B: 1 stale packed weights" in capsys.readouterr().out
    assert not (tmp_path / "cache" / "native" / "linked").is_symlink()

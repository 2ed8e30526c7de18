"""A GGUF file's layout and sizes are checked as it is read: damaged files are a clear error, not 20 GB of memory, a
hang or weights read from the wrong bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import write_tiny_gguf

from quickdraft.errors import ModelFilesError
from quickdraft.models.gguf_check import check_gguf


def after(data: bytes, text: bytes) -> int:
    """Where the bytes after the first ``text`` (a key or a tensor's name) begin."""
    return data.index(text) + len(text)


def patched(good: Path, tmp_path: Path, name: str, at: int, value: bytes) -> Path:
    data = bytearray(good.read_bytes())
    data[at : at + len(value)] = value
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "good.gguf")


def test_a_good_file_passes(good: Path) -> None:
    check_gguf(good)


def test_damaged_files_are_clear_errors(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    types = after(data, b"tokenizer.ggml.token_type") + 8  # value type, item type, then the count
    count = after(data, b"qwen2.block_count") + 4  # value type, then the value
    names = (b"token_embd.weight", b"output.weight")
    embedding, output = (after(data, struct.pack("<Q", len(name)) + name) for name in names)  # their tensor infos
    offset = 4 + 2 * 8 + 4  # a tensor's info: 2 dimensions, its type, then its offset
    embedding_offset = data[embedding + offset : embedding + offset + 8]
    cases = {
        "cut": (cut, "past the file's end: it is cut short or corrupt"),
        "count": (
            patched(good, tmp_path, "count", types, struct.pack("<Q", 2**40)),
            "said to hold 1099511627776 items",
        ),
        "layers": (patched(good, tmp_path, "layers", count, struct.pack("<I", 2**31)), "says 2147483648 layers"),
        "overlap": (patched(good, tmp_path, "overlap", output + offset, embedding_offset), "share bytes"),
        "magic": (patched(good, tmp_path, "magic", 0, b"GGUX"), "does not start with GGUF"),
    }
    for name, (path, words) in cases.items():
        with pytest.raises(ModelFilesError, match=words):
            check_gguf(path)
        assert name


def test_sizes_and_widths_are_the_models(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    embedding_length = after(data, b"qwen2.embedding_length") + 4
    epsilon = after(data, b"qwen2.attention.layer_norm_rms_epsilon") + 4
    wide = patched(good, tmp_path, "wide", embedding_length, struct.pack("<I", 512))
    with pytest.raises(ModelFilesError, match=r"is 256 wide, but the model's sizes make it 512"):
        check_gguf(wide)
    with pytest.raises(ModelFilesError, match=r"layer_norm_rms_epsilon is nan: a finite number above 0"):
        check_gguf(patched(good, tmp_path, "epsilon", epsilon, struct.pack("<f", float("nan"))))
    with pytest.raises(ModelFilesError, match=r"embedding_length is 0"):
        check_gguf(patched(good, tmp_path, "zero", embedding_length, struct.pack("<I", 0)))


def test_the_embedding_and_output_have_a_row_per_token() -> None:
    """As llama.cpp requires: a prompt's token past the embedding's rows would be read from outside it."""
    from quickdraft.models.gguf_check import Corrupt, _check_sizes

    metadata = {"general.architecture": "qwen2", "qwen2.block_count": 1, "qwen2.embedding_length": 8,
                "qwen2.attention.head_count": 2, "tokenizer.ggml.tokens": ["a"] * 100}  # fmt: skip
    infos = [("blk.0.attn_norm.weight", [8]), ("token_embd.weight", [8, 100])]
    _check_sizes(metadata, infos)
    for name in ("token_embd.weight", "output.weight"):
        with pytest.raises(Corrupt, match=f"tensor {name} has 64 rows, but the vocabulary has 100 tokens"):
            _check_sizes(metadata, [*infos, (name, [8, 64])])


def test_an_up_projection_without_a_gate_may_hold_both() -> None:
    """Phi-3's files (llama.cpp's converter) store gate and up in one ``ffn_up`` of twice the rows and no ``ffn_gate``:
    such a file passes; twice the rows beside a gate, or any other count, does not."""
    from quickdraft.models.gguf_check import Corrupt, _check_sizes

    metadata = {"general.architecture": "phi3", "phi3.block_count": 1, "phi3.embedding_length": 8,
                "phi3.attention.head_count": 2, "phi3.feed_forward_length": 16,
                "tokenizer.ggml.tokens": ["a"]}  # fmt: skip
    down = ("blk.0.ffn_down.weight", [16, 8])
    _check_sizes(metadata, [down, ("blk.0.ffn_up.weight", [8, 32])])
    _check_sizes(metadata, [down, ("blk.0.ffn_up.weight", [8, 16])])  # an up projection alone
    gate = ("blk.0.ffn_gate.weight", [8, 16])
    with pytest.raises(Corrupt, match=r"tensor blk\.0\.ffn_up\.weight has 32 rows, but the model's sizes make it 16"):
        _check_sizes(metadata, [down, gate, ("blk.0.ffn_up.weight", [8, 32])])
    with pytest.raises(Corrupt, match=r"tensor blk\.0\.ffn_up\.weight has 24 rows, but the model's sizes make it 16"):
        _check_sizes(metadata, [down, ("blk.0.ffn_up.weight", [8, 24])])


def test_a_file_without_its_tokenizer_is_a_clear_error() -> None:
    """Read by transformers, such a file was a KeyError ('tokens', or 'scores' for missing merges), an IndexError
    (an end token past the vocabulary) or a TypeError (token ids for texts)."""
    from quickdraft.models.gguf_check import Corrupt, _check_sizes

    metadata = {"general.architecture": "qwen2", "qwen2.block_count": 1, "qwen2.embedding_length": 8,
                "qwen2.attention.head_count": 2, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 1}  # fmt: skip
    infos = [("blk.0.attn_norm.weight", [8])]
    _check_sizes(metadata, infos)
    _check_sizes(metadata | {"tokenizer.ggml.eot_token_id": 7}, infos)  # one transformers does not read: llama.cpp's
    for changed, words in (
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens, the tokenizer's token texts, is missing"),
        ({"tokenizer.ggml.tokens": [1, 2]}, "not a list of texts"),
        ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges is missing: a BPE tokenizer"),
        ({"tokenizer.ggml.eos_token_id": 2}, r"tokenizer.ggml.eos_token_id is 2: a token id in 0\.\.1"),
        ({"tokenizer.ggml.bos_token_id": "a"}, "tokenizer.ggml.bos_token_id is 'a'"),
    ):
        with pytest.raises(Corrupt, match=words):
            _check_sizes({key: value for key, value in (metadata | changed).items() if value is not None}, infos)


def test_biases_and_rope_factors_have_their_layers_sizes() -> None:
    """A q bias of the wrong length or a rope_freqs of the wrong count was a traceback at the first forward."""
    from quickdraft.models.gguf_check import Corrupt, _check_sizes

    metadata = {"general.architecture": "qwen2", "qwen2.block_count": 1, "qwen2.embedding_length": 8,
                "qwen2.attention.head_count": 2, "qwen2.attention.head_count_kv": 1,
                "tokenizer.ggml.tokens": ["a"]}  # fmt: skip
    good = [("blk.0.attn_q.bias", [8]), ("blk.0.attn_k.bias", [4]), ("rope_freqs.weight", [2])]
    _check_sizes(metadata, good)
    with pytest.raises(Corrupt, match=r"tensor blk\.0\.attn_q\.bias holds 7 values, but the model's sizes make its"):
        _check_sizes(metadata, [("blk.0.attn_q.bias", [7])])
    with pytest.raises(Corrupt, match=r"tensor rope_freqs\.weight holds 7 factors, but RoPE turns 2 frequencies"):
        _check_sizes(metadata, [("rope_freqs.weight", [7])])

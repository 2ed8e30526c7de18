"""transformers' reading of a GGUF file's config and tokenizer class, from quickdraft's reader, against transformers'
own (the oracle): the same config dict, the same saved config.json, the same tokenizer class and saved files."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
from conftest import write_tiny_gguf

from quickdraft.models import DEFAULT_DRAFT, resolve_model
from quickdraft.models.convert import gguf_source, write_model_dir
from quickdraft.models.gguf_file import read_gguf
from quickdraft.models.gguf_transformers import LEGACY_NAMES, config_dict_of, config_of, tokenizer_class_of


def assert_read_as_transformers_reads_it(gguf_path: Path, saved: Path, each_step: bool = True) -> None:
    """The config and tokenizer from quickdraft's reading of ``gguf_path`` equal transformers' own, and save the
    same files; ``each_step``: the config's dict too (one more read with gguf-py, 11-19 s for a real file)."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = read_gguf(gguf_path)
    if each_step:
        assert config_dict_of(gguf) == load_gguf_checkpoint(str(gguf_path), return_tensors=False)["config"]
    expected_config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config = config_of(gguf)
    assert type(config) is type(expected_config) and config.to_dict() == expected_config.to_dict()
    assert config._name_or_path == expected_config._name_or_path
    expected_tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer_class = tokenizer_class_of(config, gguf_path)
    assert tokenizer_class is type(expected_tokenizer)
    tokenizer = tokenizer_class.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for name, made in (("expected", (expected_config, expected_tokenizer)), ("ours", (config, tokenizer))):
        for part in made:
            part.save_pretrained(saved / name)
    comparison = filecmp.dircmp(saved / "expected", saved / "ours")
    assert comparison.left_only == comparison.right_only == comparison.diff_files == []


def tiny_file(folder: Path, architecture: str) -> Path:
    """A tiny file of ``architecture`` alone in ``folder``; mixtures of experts with 4 of them."""
    folder.mkdir()
    experts = 4 if architecture.endswith("moe") else 0
    return write_tiny_gguf(folder / "model.gguf", architecture, tied=architecture.startswith("gemma"), experts=experts)


@pytest.mark.parametrize("architecture", sorted(LEGACY_NAMES))
def test_a_legacy_architectures_config_and_tokenizer_are_transformers_own(tmp_path: Path, architecture: str) -> None:
    assert_read_as_transformers_reads_it(tiny_file(tmp_path / "file", architecture), tmp_path / "saved")


@pytest.mark.parametrize("architecture", ["stablelm", "falcon", "bloom"])
def test_other_architectures_tokenizer_class_is_transformers_own(tmp_path: Path, architecture: str) -> None:
    """With the config transformers reads for them."""
    from transformers import AutoConfig, AutoTokenizer

    gguf_path = tiny_file(tmp_path / "file", architecture)
    assert config_of(read_gguf(gguf_path)) is None
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    expected = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    assert tokenizer_class_of(config, gguf_path) is type(expected)


@pytest.mark.real_model
@pytest.mark.parametrize("model", [DEFAULT_DRAFT, "gemma-3-270m"])
def test_real_files_configs_and_tokenizers_are_transformers_own(tmp_path: Path, model: str) -> None:
    """The default draft's 151,936 byte-level tokens and their merges, Gemma 3's 262,144 SentencePiece tokens."""
    source = gguf_source(resolve_model(model, progress=False))
    assert source is not None
    assert_read_as_transformers_reads_it(source, tmp_path, each_step=False)


def test_other_architectures_and_values_read_otherwise_are_left_to_transformers(tmp_path: Path) -> None:
    import gguf

    assert config_dict_of(read_gguf(write_tiny_gguf(tmp_path / "gpt-oss.gguf", "gpt-oss"))) is None
    writer = gguf.GGUFWriter(tmp_path / "values.gguf", "llama")
    writer.add_name("mistral")  # transformers reads such a llama file as Mistral
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert config_dict_of(read_gguf(tmp_path / "values.gguf")) is None
    for value in (["one"], [[1, 2]], "bad \ufffd byte"):  # an array of one item reads as the item there
        file = read_gguf(write_tiny_gguf(tmp_path / "ok.gguf"))
        file.fields["qwen2.context_length"] = value
        assert config_dict_of(file) is None


def test_a_folder_with_tokenizer_files_leaves_the_class_to_transformers(tmp_path: Path) -> None:
    gguf_path = write_tiny_gguf(tmp_path / "model.gguf")
    config = config_of(read_gguf(gguf_path))
    assert tokenizer_class_of(config, gguf_path).__name__ == "Qwen2Tokenizer"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend"}))
    assert tokenizer_class_of(config, gguf_path) is None


def test_a_folder_that_cannot_be_listed_leaves_the_class_to_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf_path = write_tiny_gguf(tmp_path / "model.gguf")
    config = config_of(read_gguf(gguf_path))

    def unlisted(self: Path) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", unlisted)
    assert tokenizer_class_of(config, gguf_path) is None


def test_a_model_directory_is_written_without_gguf_pys_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader that took about ten seconds a file is not used for a generic architecture."""
    import gguf

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("gguf-py's reader was used")

    gguf_path = tiny_file(tmp_path / "file", "qwen2")
    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    write_model_dir(gguf_path, tmp_path / "model", "0" * 64)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["model_type"] == "qwen2"
    assert json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"

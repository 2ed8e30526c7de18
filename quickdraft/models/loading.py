"""Resolve a model argument to a local transformers directory and load it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError
from quickdraft.models.catalog import KNOWN_MODELS, cache_root, file_sha256, unpack
from quickdraft.models.convert import ensure_fp32_weights, is_model_dir, write_model_dir


def resolve_model(spec: str | Path, progress: bool = True) -> Path:
    """A packaged model name, a transformers directory or a ``.gguf`` file -> directory. A GGUF file's
    directory (in the cache, keyed by its sha256) holds its configs and tokenizer and names the file,
    which the native runtime reads its weights from."""
    if str(spec) in KNOWN_MODELS:
        return unpack(KNOWN_MODELS[str(spec)], progress=progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelFilesError(f"{path} is not a transformers model directory: it has no config.json")
        return path.resolve()
    if path.is_file() and path.suffix == ".gguf":
        sha256 = file_sha256(path, progress)
        hf_dir = cache_root() / "converted" / sha256[:16] / "hf"
        if not is_model_dir(hf_dir, sha256, path):
            write_model_dir(path.resolve(), hf_dir, sha256)
        return hf_dir
    known = ", ".join(KNOWN_MODELS)
    if path.exists():
        raise ModelFilesError(f"{path} is neither a model directory nor a .gguf file")
    raise ModelFilesError(f"model {str(spec)!r} not found: give a directory, a .gguf file or one of: {known}")


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as error:  # tokenizers and transformers raise many types here
        raise _unreadable(path, error) from error


def load_hf_model(path: Path, progress: bool = True) -> Any:
    """Load a causal LM in fp32 for CPU inference, turning file problems into clear errors. A directory made
    from a GGUF file gets its fp32 weights first, once (``ensure_fp32_weights``)."""
    import torch
    from transformers import AutoModelForCausalLM

    ensure_fp32_weights(path, progress)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as error:  # safetensors, json and transformers raise many types here
        raise _unreadable(path, error) from error
    return model.eval()


def _unreadable(path: Path, error: Exception) -> ModelFilesError:
    return ModelFilesError(
        f"cannot load the model in {path}: {type(error).__name__}: {error}. If it is in quickdraft's cache, "
        f"delete that directory and run `quickdraft models` to rebuild it"
    )

"""Finding, preparing and loading models: packaged names, HF directories, GGUF files."""

from quickdraft.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, PackagedModel, unpack
from quickdraft.models.loading import load_hf_model, load_tokenizer, resolve_model
from quickdraft.models.pairing import check_same_tokenizer, find_draft

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "KNOWN_MODELS",
    "PackagedModel",
    "check_same_tokenizer",
    "find_draft",
    "load_hf_model",
    "load_tokenizer",
    "resolve_model",
    "unpack",
]

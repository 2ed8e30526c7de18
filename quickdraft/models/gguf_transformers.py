"""What transformers reads from a GGUF file's metadata, taken from quickdraft's own reading of the file.

For most architectures transformers 5 reads a GGUF file's config with gguf-py's ``GGUFReader``, which makes numpy
views of every string of the vocabulary (slow for a vocabulary of 150,000 tokens), and
``AutoTokenizer`` reads the file that way once more to choose its tokenizer's class. These two functions give the
same results from :func:`quickdraft.models.gguf_file.read_gguf`'s values, or None where they cannot promise that, and
the caller then takes transformers' own path.

Rules:
- :func:`config_of` is the config ``AutoConfig.from_pretrained(..., gguf_file=...)`` builds for the architectures
  that transformers' legacy reader (``load_gguf_checkpoint``) reads by its key table alone, under the names of
  :data:`LEGACY_NAMES`: ``GGUF_CONFIG_MAPPING`` renames each key in the file's order (of two keys naming one
  setting, the last wins), ``tie_word_embeddings`` is whether the file lacks ``output.weight``, and a missing
  ``vocab_size`` is the vocabulary's length. Values that reader may parse otherwise leave the file to transformers:
  a one-item array (it unwraps it), a string holding U+FFFD (which may be a byte that is not UTF-8, which it
  refuses), an array of arrays.
- :func:`tokenizer_class_of` is the class ``AutoTokenizer.from_pretrained(..., gguf_file=...)`` instantiates when
  the file's folder holds nothing a tokenizer reads besides GGUF files (no JSON, SentencePiece or tiktoken files)
  and the config names no tokenizer class: the class transformers registers for the config's type
  (``TokenizersBackend`` where it registers none), unless that is Mistral's own backend, which depends on more
  than the file. (AutoTokenizer's checks of a checkpoint's name never match a GGUF file: the config it builds for
  one has an empty name.)

``tests/test_gguf_transformers.py`` holds both equal to transformers' own for every architecture of
:data:`LEGACY_NAMES`, the tokenizer class for others too, and both on the default pair's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickdraft.models.gguf_file import GGUFFile

# A file's architecture -> the name load_gguf_checkpoint reads its keys and strings under, and the model type it gives:
# the architectures it reads by its key table alone, with at most these renames (it also renames gpt-oss, t5 and
# minimax, reads stablelm's and lfm2's tensors, ties falcon's and bloom's embeddings and reads llama files named
# "mistral" as Mistral; qwen35 and lfm2 have another reader)
LEGACY_NAMES = {name: (name, name) for name in (
    "llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "starcoder2", "mamba", "nemotron", "gemma2",
)} | {
    "qwen2moe": ("qwen2_moe", "qwen2_moe"), "qwen3moe": ("qwen3_moe", "qwen3_moe"), "gemma3": ("gemma3", "gemma3_text"),
}  # fmt: skip
# Files beside a GGUF file that AutoTokenizer may read to choose or build a tokenizer
TOKENIZER_SUFFIXES = (".json", ".model", ".tiktoken")


def config_dict_of(gguf: GGUFFile) -> dict[str, Any] | None:
    """``load_gguf_checkpoint(gguf.path)["config"]`` for a file of an architecture in :data:`LEGACY_NAMES` (None:
    another architecture, or a value that reader parses differently)."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    fields, architecture = gguf.fields, gguf.architecture
    if architecture not in LEGACY_NAMES or (architecture == "llama" and fields.get("general.name") == "mistral"):
        return None
    name, model_type = LEGACY_NAMES[architecture]
    config: dict[str, Any] = {"tie_word_embeddings": all(tensor.name != "output.weight" for tensor in gguf.tensors)}
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(name, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {})
    for key, value in defaults.items():
        config.setdefault(key, value)
    for key, value in fields.items():
        prefix, _, rest = key.replace(architecture, name).partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest, -1)
        if renamed == -1 or renamed is None:
            continue
        if not parsed_alike(value):
            return None
        config[renamed] = value.replace(architecture, name) if isinstance(value, str) else value
    if config.get("model_type") == name:
        config["model_type"] = model_type
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in fields:
        tokens = fields["tokenizer.ggml.tokens"]
        if not isinstance(tokens, list) or len(tokens) == 1:  # (the count, whatever the tokens' bytes)
            return None
        config["vocab_size"] = len(tokens)
    return config


def parsed_alike(value: Any) -> bool:
    """Whether gguf-py's reader, as transformers parses it, surely gives this value too."""
    if isinstance(value, str):
        return "\ufffd" not in value  # a byte replaced, which that reader refuses (or the character itself)
    if isinstance(value, list):
        return len(value) != 1 and all(not isinstance(item, list) and parsed_alike(item) for item in value)
    return True


def config_of(gguf: GGUFFile) -> Any:
    """The transformers config ``AutoConfig.from_pretrained`` reads from the file (None: see :func:`config_dict_of`,
    or a model type transformers does not know, which its own path reports)."""
    from transformers import CONFIG_MAPPING

    config_dict = config_dict_of(gguf)
    if config_dict is None or config_dict.get("model_type") not in CONFIG_MAPPING:
        return None
    config = CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
    config._name_or_path = str(gguf.path.parent)  # as from_pretrained names it
    return config


def tokenizer_class_of(config: Any, gguf_path: Path) -> Any:
    """The tokenizer class ``AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)`` takes for a
    file whose config is ``config`` (None where something besides the file could change it)."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    try:
        if any(path.name.endswith(TOKENIZER_SUFFIXES) for path in gguf_path.parent.iterdir() if path.is_file()):
            return None
    except OSError:  # a folder that cannot be listed: transformers never lists it
        return None
    if getattr(config, "tokenizer_class", None):
        return None
    tokenizer_class = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    if tokenizer_class is None or tokenizer_class.__name__ == "MistralCommonBackend":
        return None
    return tokenizer_class

"""What transformers loaded from a model's files, checked: it fills a weight the files lack with random values, and
it leaves out a GGUF tensor its model class has no place for; either way the model would answer, wrongly, without a
word. Both are a ``ModelFilesError`` instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError

# GGUF tensors read into the config, not the weights (gguf_settings.gguf_settings): RoPE's frequency factors
CONFIG_TENSORS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})


def check_loading_info(info: dict[str, Any], where: Path) -> None:
    """Refuse weights the files lack or hold in another shape (``from_pretrained``'s ``output_loading_info``)."""
    missing = [*info.get("missing_keys", ()), *(str(key) for key in info.get("mismatched_keys", ()))]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelFilesError(f"the weights in {where} lack {', '.join(missing[:3])}{more}: the files are incomplete")


def check_every_tensor_read(model: Any, source: Path) -> None:
    """Refuse a GGUF file whose tensors hold more weights than the model transformers made of it has parameters
    (those of :data:`CONFIG_TENSORS` aside): transformers' reader skips a tensor it has no name for, such as a norm
    the model class lacks. Reshaping, splitting experts and permuting heads keep a tensor's count of weights, so
    the counts agree exactly when every tensor was read. A tied model's output layer that the file stores again as a
    copy of the embedding (older converters' Bloom files) is read: it is the embedding."""
    import numpy as np

    from quickdraft.models.gguf_file import read_gguf

    tensors = {tensor.name: tensor for tensor in read_gguf(source).tensors if tensor.name not in CONFIG_TENSORS}
    stored = sum(int(tensor.n_elements) for tensor in tensors.values())
    output, embedding = tensors.get("output.weight"), tensors.get("token_embd.weight")
    if getattr(model.config, "tie_word_embeddings", False) and output is not None and embedding is not None:
        same = output.tensor_type == embedding.tensor_type and np.array_equal(output.data, embedding.data)
        stored -= int(output.n_elements) if same else 0
    read = sum(parameter.numel() for parameter in model.parameters())  # a tied embedding once
    if stored > read:
        message = f"{source} holds {stored - read:,} weights that transformers' {type(model).__name__} does not read"
        raise ModelFilesError(f"{message}: it would run without them and answer wrongly")

"""A GGUF model's sizes checked before anything reads it as a model (its layout is checked as it is read:
``gguf_file``): tensors whose widths the sizes do not make, or fewer layers than the file holds, gave wrong answers or
tracebacks.

Rules (:func:`check_gguf`, a ``ModelFilesError`` saying what is wrong):
- The layout rules of :func:`quickdraft.models.gguf_file.read_gguf`.
- The model's sizes (``<architecture>.block_count``, ``embedding_length`` and ``attention.head_count`` present; the
  other head counts and widths where given) are whole numbers of at least 1, its norm epsilon and RoPE base finite
  and above 0, ``block_count`` is the number of ``blk.N`` layers the file holds, and the usual tensors (embedding,
  attention, feed-forward, norms) are as wide and have as many rows as those sizes make them (a layer's ``ffn_up``
  without an ``ffn_gate`` beside it may hold both, twice the rows, as Phi-3's does); the embedding and the output
  layer have a row per token of the vocabulary, as llama.cpp requires.
- A bias has a value per row of its layer, and ``rope_freqs`` a factor per frequency RoPE turns.
- The tokenizer is in the file: its token texts, a BPE tokenizer's merges, the special token ids transformers reads
  (:data:`READ_SPECIAL_TOKENS`) among the tokens.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError
from quickdraft.models.gguf_file import Corrupt, GGUFFile, read_gguf

SIZES = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
         "attention.key_length", "attention.value_length", "context_length")  # fmt: skip
REQUIRED = ("block_count", "embedding_length", "attention.head_count")  # every architecture llama.cpp runs has them
POSITIVE = ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base")
LAYER = re.compile(r"blk\.(\d+)\.")
# the special tokens transformers' reader looks up among the tokens (llama.cpp warns of any other out of range, and
# end_tokens leaves such an end token out)
READ_SPECIAL_TOKENS = ("bos", "eos", "unknown", "padding")
Info = tuple[str, tuple[int, ...]]  # a tensor's name and shape (GGUF's order)


def check_gguf(path: Path) -> GGUFFile:
    """The GGUF file at ``path``, read; ``ModelFilesError`` for one whose layout or sizes are wrong (the rules
    above)."""
    gguf = read_gguf(path)
    try:
        _check_sizes(gguf.fields, [(tensor.name, tensor.shape) for tensor in gguf.tensors])
    except Corrupt as error:
        raise ModelFilesError(f"{path} is not a GGUF file quickdraft can read: {error}") from None
    return gguf


def _check_sizes(metadata: dict[str, Any], infos: list[Info]) -> None:
    """The model's sizes are whole numbers >= 1 (per layer too), its epsilon and RoPE base > 0, and its layer count
    the file's."""
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise Corrupt("general.architecture is missing or not a name")
    for key in REQUIRED:
        if f"{architecture}.{key}" not in metadata:
            raise Corrupt(f"{architecture}.{key} is missing")
    for key in SIZES:
        value = metadata.get(f"{architecture}.{key}")
        values = value if isinstance(value, list) else [value]
        if value is not None and not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            raise Corrupt(f"{architecture}.{key} is {value!r}: a whole number of at least 1")
    for key in POSITIVE:
        value = metadata.get(f"{architecture}.{key}")
        if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise Corrupt(f"{architecture}.{key} is {value!r}: a finite number above 0")
    layers = {int(match.group(1)) for name, _ in infos if (match := LAYER.match(name))}
    stated = metadata.get(f"{architecture}.block_count")
    if layers and isinstance(stated, int) and (len(layers) != stated or max(layers) != stated - 1):
        held = f"layers {min(layers)} to {max(layers)}" if len(layers) > 1 else f"layer {min(layers)}"
        raise Corrupt(f"{architecture}.block_count says {stated} layers, but it holds {held}")
    _check_widths(metadata, architecture, infos)
    tokens = metadata.get("tokenizer.ggml.tokens")
    _check_tokenizer(metadata, tokens)
    count = len(tokens) if isinstance(tokens, list) else None
    for name, shape in infos:
        if name in ("token_embd.weight", "output.weight") and count is not None and shape[-1] != count:
            raise Corrupt(f"tensor {name} has {shape[-1]} rows, but the vocabulary has {count} tokens")


def _check_tokenizer(metadata: dict[str, Any], tokens: Any) -> None:
    """The file holds its tokenizer, as every model quickdraft runs needs: a list of token texts, the merges of a BPE
    one (``gpt2``), and special tokens among them."""
    if not isinstance(tokens, list) or not tokens or not all(isinstance(token, str) for token in tokens):
        raise Corrupt("tokenizer.ggml.tokens, the tokenizer's token texts, is missing or not a list of texts")
    if metadata.get("tokenizer.ggml.model") == "gpt2" and not isinstance(metadata.get("tokenizer.ggml.merges"), list):
        raise Corrupt("tokenizer.ggml.merges is missing: a BPE tokenizer (gpt2) needs its merges")
    for name in READ_SPECIAL_TOKENS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in metadata and not (isinstance(metadata[key], int) and 0 <= metadata[key] < len(tokens)):
            raise Corrupt(f"{key} is {metadata[key]!r}: a token id in 0..{len(tokens) - 1}")


def _check_widths(metadata: dict[str, Any], architecture: str, infos: list[Info]) -> None:
    """The usual tensors' widths (GGUF's first dimension: what a row multiplies) are the model's sizes: hidden
    ``embedding_length`` in, or the heads' output for ``attn_output`` and ``feed_forward_length`` for ``ffn_down``;
    and the query, key and value rows the heads' (where the file says how many, of one count for every layer)."""
    hidden, heads = (
        metadata.get(f"{architecture}.embedding_length"),
        metadata.get(f"{architecture}.attention.head_count"),
    )
    kv_heads, ffn = metadata.get(f"{architecture}.attention.head_count_kv", heads), metadata.get(
        f"{architecture}.feed_forward_length")  # fmt: skip
    if not isinstance(hidden, int):
        return
    key = metadata.get(f"{architecture}.attention.key_length") or (hidden // heads if isinstance(heads, int) else None)
    value = metadata.get(f"{architecture}.attention.value_length") or key
    widths = {"token_embd": hidden, "output": hidden, "output_norm": hidden, "attn_norm": hidden,
              "ffn_norm": hidden, "attn_q": hidden, "attn_k": hidden, "attn_v": hidden, "ffn_gate": hidden,
              "ffn_up": hidden}  # fmt: skip
    if isinstance(heads, int) and isinstance(value, int):
        widths["attn_output"] = heads * value
    if isinstance(ffn, int):
        widths["ffn_down"] = ffn
    rows = {"attn_output": hidden, "ffn_down": hidden} | (
        {"ffn_gate": ffn, "ffn_up": ffn} if isinstance(ffn, int) else {}
    )
    if isinstance(heads, int) and isinstance(key, int):
        rows["attn_q"] = heads * key
        if isinstance(kv_heads, int) and isinstance(value, int):
            rows |= {"attn_k": kv_heads * key, "attn_v": kv_heads * value}
    names = {name for name, _ in infos}
    rotary = metadata.get(f"{architecture}.rope.dimension_count") or key
    for name, shape in infos:
        if name == "rope_freqs.weight" and isinstance(rotary, int) and shape[0] != rotary // 2:
            raise Corrupt(f"tensor {name} holds {shape[0]} factors, but RoPE turns {rotary // 2} frequencies")
        bias = rows.get(name.removesuffix(".bias").rsplit(".", 1)[-1]) if name.endswith(".bias") else None
        if bias is not None and shape[0] != bias:
            raise Corrupt(f"tensor {name} holds {shape[0]} values, but the model's sizes make its layer {bias}")
        if not name.endswith(".weight"):
            continue
        part = name.removesuffix(".weight").rsplit(".", 1)[-1]
        if part in widths and shape[0] != widths[part]:
            raise Corrupt(f"tensor {name} is {shape[0]} wide, but the model's sizes make it {widths[part]}")
        expected = rows.get(part)
        fused = part == "ffn_up" and name.replace(".ffn_up.", ".ffn_gate.") not in names  # Phi-3's gate and up
        if fused and expected is not None and len(shape) > 1 and shape[1] == 2 * expected:
            expected = 2 * expected
        if expected is not None and len(shape) > 1 and shape[1] != expected:
            raise Corrupt(f"tensor {name} has {shape[1]} rows, but the model's sizes make it {expected}")

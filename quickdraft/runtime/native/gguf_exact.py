"""Which of a GGUF file's tensors a model keeps as stored: the linear weights (and the embedding) of the types
whose decoders ``gguf_blocks.py`` and ``gguf_iquants.py`` hold, by transformers name.

A family whose converter interleaves each head's two rotary halves (``Architecture.gguf_interleaves_rotary``: Llama's,
Mistral's, Mixtral's, SmolLM3's, Granite's) has its q and k rows put back in transformers' order, field by field: a
block format's rows are independent, so that moves whole rows of codes and scales and rounds nothing.

A directory converted from a GGUF file before the ``gguf`` layout offers its fp32 weights beside the file: only
tensors whose values match those weights are used there, and a tensor that does not match is left to the usual path,
where the runtime quantizes its float values.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from quickdraft.runtime.native.architecture import GGUF_INTERLEAVED_ROTARY
from quickdraft.runtime.native.gguf_blocks import (
    LEGACY_WEIGHTS,
    Q4_K_WEIGHTS,
    ExactWeight,
    decode_iq4_nl,
    decode_q2_k,
    decode_q3_k,
    decode_q4_0,
    decode_q4_1,
    decode_q4_k,
    decode_q5_0,
    decode_q5_1,
    decode_q5_k,
    decode_q6_k,
    decode_q8_0,
    decode_tq1_0,
    decode_tq2_0,
    q4_weight,
    transformers_name,
)
from quickdraft.runtime.native.gguf_fp4 import decode_mxfp4, decode_nvfp4, mxfp4_fits, nvfp4_fits
from quickdraft.runtime.native.gguf_iquants import (
    decode_iq1_m,
    decode_iq1_s,
    decode_iq2_s,
    decode_iq2_xs,
    decode_iq2_xxs,
    decode_iq3_s,
    decode_iq3_xxs,
    decode_iq4_xs,
)

EXACT_DECODERS = {  # GGUF tensor types kept as stored -> their decoder (raw bytes, rows, width) -> ExactWeight
    "Q4_K": lambda raw, rows, width: q4_weight(decode_q4_k(raw, rows, width)),
    "Q5_K": decode_q5_k,
    "Q6_K": decode_q6_k,
    "Q3_K": decode_q3_k,
    "Q2_K": decode_q2_k,
    "Q8_0": decode_q8_0,
    "Q5_0": decode_q5_0,
    "Q4_0": decode_q4_0,
    "Q5_1": decode_q5_1,
    "Q4_1": decode_q4_1,
    "IQ4_NL": decode_iq4_nl,
    "IQ4_XS": decode_iq4_xs,
    "IQ3_XXS": decode_iq3_xxs,
    "IQ3_S": decode_iq3_s,
    "IQ2_XXS": decode_iq2_xxs,
    "IQ2_XS": decode_iq2_xs,
    "IQ2_S": decode_iq2_s,
    "IQ1_S": decode_iq1_s,
    "IQ1_M": decode_iq1_m,
    "TQ2_0": decode_tq2_0,
    "TQ1_0": decode_tq1_0,
    "MXFP4": decode_mxfp4,
    "NVFP4": decode_nvfp4,
}
BLOCK_WEIGHTS = dict.fromkeys(("Q8_0", "Q5_0", "Q4_0", "Q5_1", "Q4_1", "IQ4_NL", "MXFP4"), LEGACY_WEIGHTS)  # else 256
# The types whose parts hold a tensor's blocks only while its scales lie in a range: (raw bytes, rows, width) ->
# whether they do. A tensor outside it is read as floats (7 bits), as a type without a decoder is.
DECODES_WHEN = {"MXFP4": mxfp4_fits, "NVFP4": nvfp4_fits}


def decodes_exactly(tensor: Any) -> bool:
    """Whether the GGUF tensor ``tensor`` (``[rows, width]`` of a type in EXACT_DECODERS) decodes into its part's
    fields exactly (:data:`DECODES_WHEN`)."""
    check = DECODES_WHEN.get(tensor.tensor_type.name)
    if check is None or len(tensor.shape) != 2:
        return check is None  # a vector of such a type is read as floats
    width, rows = (int(n) for n in tensor.shape)  # GGUF lists the fastest dimension first
    return check(tensor.data, rows, width)


def linear_names(tensor_names: Collection[str], fused: bool = False, tied: bool = False) -> dict[str, str]:
    """GGUF name -> transformers name of each linear weight among ``tensor_names`` (:func:`transformers_name`), and
    ``token_embd.weight`` -> ``lm_head.weight`` where the embedding is the LM head: the model ties the two (``tied``:
    ``tie_word_embeddings``) and the file stores no ``output.weight`` (llama.cpp's rule; a file may store one
    anyway, and then that is the head)."""
    names = {name: linear for name in tensor_names if (linear := transformers_name(name, fused)) is not None}
    if tied and "output.weight" not in tensor_names and "token_embd.weight" in tensor_names:
        names["token_embd.weight"] = "lm_head.weight"
    return names


def unpermute_rows(values: Any, heads: int) -> Any:
    """llama.cpp's row order of a q or k projection ``[heads·head_dim, ...]`` -> transformers' (each head's rows
    ``(i, half)`` -> ``(half, i)``), as transformers' ``LlamaTensorProcessor`` computes it: of a numpy array's or a
    tensor's first axis."""
    dim = values.shape[0] // heads // 2
    return values.reshape(heads, dim, 2, *values.shape[1:]).swapaxes(2, 1).reshape(values.shape)


def rotary_row_heads(gguf_name: str, architecture: str, heads: int, kv_heads: int) -> int | None:
    """The heads whose rows the converter of ``architecture`` interleaved in the tensor ``gguf_name`` (``heads`` for
    a q projection, ``kv_heads`` for a k one), or None where the file keeps transformers' row order."""
    if architecture not in GGUF_INTERLEAVED_ROTARY:
        return None
    return heads if ".attn_q." in gguf_name else kv_heads if ".attn_k." in gguf_name else None


def unpermuted(weight: ExactWeight, heads: int | None) -> ExactWeight:
    """A decoded weight with its rows in transformers' order (``heads``: :func:`rotary_row_heads`; None: as it is).
    Every field of a block format holds the rows first."""
    kind, fields = weight
    return weight if heads is None else (kind, tuple(unpermute_rows(field, heads) for field in fields))


def exact_weights(
    gguf_path: Path,
    float_weights: dict[str, torch.Tensor],
    fused: bool = False,
    types: tuple[str, ...] = ("Q4_K",),
    tied: bool = False,
    heads: tuple[int, int] | None = None,
) -> dict[str, ExactWeight]:
    """The tensors of ``gguf_path`` of ``types`` (keys of EXACT_DECODERS) by transformers name (``fused``: see
    :func:`transformers_name`; ``tied``: the model ties its LM head to its embeddings, see :func:`linear_names`;
    ``heads``: the model's query and key-value heads, for :func:`rotary_row_heads`; None: rows as stored), those
    whose values equal ``float_weights``' (the model converted from this file) within float32 rounding, checked on 64
    rows spread over each tensor."""
    from quickdraft.models.gguf_file import read_gguf
    from quickdraft.runtime.native.formats import PART_KINDS

    gguf = read_gguf(gguf_path)
    tensors = gguf.tensors
    names = linear_names([tensor.name for tensor in tensors], fused, tied)
    found: dict[str, ExactWeight] = {}
    for tensor in tensors:
        name = names.get(tensor.name)
        source = "model.embed_tokens.weight" if tensor.name == "token_embd.weight" else name  # the float weight
        if tensor.tensor_type.name not in types or name is None or source not in float_weights:
            continue
        rows, width = float_weights[source].shape
        block = BLOCK_WEIGHTS.get(tensor.tensor_type.name, Q4_K_WEIGHTS)
        if tuple(int(n) for n in tensor.shape) != (width, rows) or width % block or not decodes_exactly(tensor):
            continue
        decoded = EXACT_DECODERS[tensor.tensor_type.name](tensor.data, rows, width)
        row_heads = None if heads is None else rotary_row_heads(tensor.name, gguf.architecture, *heads)
        kind, fields = unpermuted(decoded, row_heads)
        sample = torch.arange(0, rows, max(1, rows // 64))  # rows spread over the tensor: any reordering shows
        values = PART_KINDS[kind].from_blocks(*(field[sample] for field in fields)).dequantize()
        reference = float_weights[source][sample].float()
        if float((values - reference).abs().max()) <= 1e-6 * float(reference.abs().max()):
            found[name] = kind, fields
    return found

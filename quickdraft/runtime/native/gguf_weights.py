"""A GGUF file's tensors under transformers' names, read one at a time: the input of ``quantize_state_dict``.

The float tensors are the values transformers' GGUF loader gives (``modeling_gguf_pytorch_utils``, the loader
of the Llama and Qwen2 families): ``gguf.quants.dequantize`` of each tensor (for the types ``gguf_exact`` decodes,
the same values from their parts' own arithmetic, faster), float16 and bfloat16 widened to float32, and for a file
of an architecture whose converter interleaves the two rotary halves of each head
(``Architecture.gguf_interleaves_rotary``: Llama's, Mistral's, Mixtral's, SmolLM3's, Granite's) the q and k rows
put back in transformers' order, as transformers undoes it. Qwen2 files need no reordering. So the weights quantized
from here are those quantized from the fp32 directory transformers would save, value for value, but for Gemma's norm
weights: they are read as stored, 1 + w (transformers' loader subtracts the 1 its layers add back, which may round), and
packed without adding it again (``quantize_state_dict``'s ``norm_offset``).

Linear weights of the types ``gguf_exact`` decodes (K-quants, the 32-weight types, the i-quants, the ternary and 4-bit
float types; MXFP4 and NVFP4 tensors where ``gguf_exact.decodes_exactly`` says their parts hold their scales) can be
offered as blocks instead, to be kept bit for bit (reordered q and k rows too: whole rows of blocks move), and so is
the embedding of those types (``embedding.py``); the rest of the file's tensors are read as floats.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quickdraft.models.gguf_file import read_gguf
from quickdraft.models.loaded import CONFIG_TENSORS
from quickdraft.runtime.native.architecture import (
    ARCHITECTURES,
    PRE_NORMS,
    LayerNorms,
    SparseMlp,
)
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.formats import BLOCK_PARTS
from quickdraft.runtime.native.gguf_blocks import FUSED_LAYER_TENSORS, LAYER_TENSORS, ExactWeight
from quickdraft.runtime.native.gguf_exact import (
    EXACT_DECODERS,
    decodes_exactly,
    linear_names,
    rotary_row_heads,
    unpermute_rows,
    unpermuted,
)

EMBEDDING = "model.embed_tokens.weight"
MODEL_TENSORS = {  # GGUF names outside the layers -> transformers names
    "token_embd.weight": EMBEDDING,
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_NORMS = ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm")  # LayerNorms' roles, GGUF's names
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}  # GGUF -> transformers names


EXPERT_TENSORS = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}  # -> SparseMlp.projections' index
ROUTER_TENSOR = "ffn_gate_inp"
SHARED_EXPERT_TENSORS = {"ffn_gate_shexp": 0, "ffn_up_shexp": 1, "ffn_down_shexp": 2}  # the same, shared expert's
SHARED_GATE_TENSOR = "ffn_gate_inp_shexp"


@dataclass(frozen=True)
class ExpertSlice:
    """One expert's ``[rows, width]`` of a GGUF tensor holding every expert's (``blk.N.ffn_*_exps``), read as a
    GGUFTensor of its own; its name is the file's with the expert's number: ``blk.N.ffn_up_exps.E.weight``."""

    name: str
    tensor_type: Any
    data: np.ndarray  # [rows, width] or [rows, bytes a row]
    shape: tuple[int, int]  # (width, rows): GGUF lists the fastest dimension first


def expert_slices(tensors: list[Any]) -> list[Any]:
    """The file's tensors with each tensor of every expert's weights replaced by one :class:`ExpertSlice` an
    expert."""
    found: list[Any] = []
    for tensor in tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in EXPERT_TENSORS or len(tensor.shape) != 3:
            found.append(tensor)
            continue
        width, rows, experts = (int(n) for n in tensor.shape)
        name = f"blk.{parts[1]}.{parts[2]}.{{}}.{parts[3]}"
        found += [ExpertSlice(name.format(e), tensor.tensor_type, tensor.data[e], (width, rows))
                  for e in range(experts)]  # fmt: skip
    return found


def shared_expert_weight(gguf_name: str) -> bool:
    """Whether ``gguf_name`` is a shared expert's linear weight (``blk.N.ffn_up_shexp.weight``)."""
    parts = gguf_name.split(".")
    return len(parts) == 4 and parts[2] in SHARED_EXPERT_TENSORS and parts[3] == "weight"


def hf_tensor_name(
    gguf_name: str, norms: LayerNorms = PRE_NORMS, fused: bool = False, sparse: SparseMlp | None = None
) -> str | None:
    """``blk.3.attn_q.bias`` -> ``model.layers.3.self_attn.q_proj.bias``, ``token_embd.weight`` ->
    ``model.embed_tokens.weight``; None for tensors transformers does not load (e.g. ``rope_freqs.weight``).
    ``norms``: the family's layer norms (a norm it does not have is not read).
    ``fused``: a model with fused projections (Phi-3's ``attn_qkv``, and ``ffn_up`` holding gate and up).
    ``sparse``: a family's mixture of experts, whose router is ``ffn_gate_inp`` and whose experts are
    :class:`ExpertSlice` names (``blk.3.ffn_up_exps.5.weight`` -> Qwen3-MoE's
    ``model.layers.3.mlp.experts.5.up_proj.weight``); a shared expert's are ``ffn_*_shexp`` and its gate
    ``ffn_gate_inp_shexp``."""
    if gguf_name in MODEL_TENSORS:
        return MODEL_TENSORS[gguf_name]
    parts = gguf_name.split(".")
    if sparse is not None and len(parts) == 5 and parts[0] == "blk" and parts[2] in EXPERT_TENSORS:
        projection = sparse.projections[EXPERT_TENSORS[parts[2]]]
        return f"model.layers.{parts[1]}.{sparse.expert.format(e=parts[3])}.{projection}.{parts[4]}"
    if sparse is not None and len(parts) == 4 and parts[2] == ROUTER_TENSOR and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{sparse.router}.weight"
    if sparse is not None and sparse.shared_expert and len(parts) == 4 and parts[3] == "weight":
        if parts[2] in SHARED_EXPERT_TENSORS:
            projection = sparse.projections[SHARED_EXPERT_TENSORS[parts[2]]]
            return f"model.layers.{parts[1]}.{sparse.shared_expert}.{projection}.weight"
        if parts[2] == SHARED_GATE_TENSOR:
            return f"model.layers.{parts[1]}.{sparse.shared_gate}.weight"
    if len(parts) != 4 or parts[0] != "blk":
        return None
    norms_by_name = norms.named(GGUF_NORMS) | QK_NORMS
    if parts[2] in norms_by_name and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{norms_by_name[parts[2]]}.weight"
    tensors = FUSED_LAYER_TENSORS if fused else LAYER_TENSORS
    if parts[2] in tensors and parts[3] in ("weight", "bias"):
        return f"model.layers.{parts[1]}.{tensors[parts[2]]}.{parts[3]}"
    return None


def non_finite(gguf_name: str) -> str:
    """The error for a tensor holding NaN or infinite values (llama.cpp runs such a file and answers nonsense)."""
    return f"tensor {gguf_name} holds NaN or infinite values: the file is damaged"


def float_values(tensor: Any) -> np.ndarray:
    """A GGUF tensor's float32 values: a block part's rows expanded by its own arithmetic (``Affine``, the values
    gguf-py gives, several times faster) for the types ``gguf_exact`` decodes where the part holds the tensor's blocks
    (``decodes_exactly``), else gguf-py's dequantization."""
    decode = EXACT_DECODERS.get(tensor.tensor_type.name)
    if decode is not None and len(tensor.shape) == 2 and decodes_exactly(tensor):
        width, rows = (int(n) for n in tensor.shape)  # GGUF lists the fastest dimension first
        kind, fields = decode(tensor.data, rows, width)  # every decoder gives a block format's fields
        return BLOCK_PARTS[kind].affine(*fields).dequantize().numpy()
    from gguf.quants import dequantize

    return dequantize(tensor.data, tensor.tensor_type)


class GGUFTensors(MutableMapping[str, torch.Tensor]):
    """float32 tensors by transformers name, dequantized when read: ``quantize_state_dict`` pops them one by
    one, so memory holds one float tensor at a time, not the model. An assigned tensor (the tied LM head)
    replaces the file's."""

    def __init__(self, sources: dict[str, Any], row_heads: dict[str, int], requantized: dict[str, str]) -> None:
        self.sources = sources  # transformers name -> GGUFTensor
        self.row_heads = row_heads  # transformers name -> heads, for q/k rows to reorder
        self.requantized = requantized  # transformers name -> GGUF type, of the linear weights read as floats
        self.assigned: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.assigned:
            return self.assigned[name]
        tensor = self.sources[name]
        with np.errstate(invalid="ignore", over="ignore"):  # a damaged file's inf and NaN: refused just below
            values = float_values(tensor)  # [rows, width] or [width]
        if not np.isfinite(values).all():
            raise ValueError(non_finite(tensor.name))
        if name in self.row_heads:
            values = unpermute_rows(values, self.row_heads[name])
        values = np.ascontiguousarray(values)  # dequantized types are new arrays; F32 ones are views of the file
        return torch.from_numpy(values if values.flags.writeable else values.copy()).float()

    def __contains__(self, name: object) -> bool:  # Mapping's would read (dequantize) the tensor
        return name in self.assigned or name in self.sources

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self.assigned[name] = value

    def __delitem__(self, name: str) -> None:
        found = self.assigned.pop(name, None) is not None
        if self.sources.pop(name, None) is None and not found:
            raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.sources.keys() | self.assigned.keys())

    def __len__(self) -> int:
        return len(self.sources.keys() | self.assigned.keys())


def requantized_note(source: str, requantized: dict[str, str]) -> str:
    """What packing the file ``source`` in the auto format says of its linear weights read as floats (``requantized``:
    transformers name -> GGUF type): how many of each type are stored in 7 bits rather than as the file stores them."""
    counts = collections.Counter(requantized.values()).most_common()
    listed = ", ".join(f"{count} {kind}" for kind, count in counts)
    types, them = ("that type is", "it") if len(counts) == 1 else ("those types are", "them")
    return (
        f"quickdraft: {source}: linear weights stored in 7 bits per output channel ({listed}): {types} not computed "
        f"as the file stores {them} (docs/families.md)"
    )


class ExactTensors(Mapping[str, ExactWeight]):
    """Weights kept as the file stores them, by transformers name, decoded into a part's fields when read (their
    rows in transformers' order)."""

    def __init__(self, sources: dict[str, Any], row_heads: dict[str, int]) -> None:
        self.sources = sources  # transformers name -> GGUFTensor of a type in EXACT_DECODERS
        self.row_heads = row_heads  # transformers name -> heads, for q/k rows to reorder
        self.last: tuple[str, ExactWeight] | None = None  # the last tensor decoded (a tied head follows its embedding)

    def __getitem__(self, name: str) -> ExactWeight:
        tensor = self.sources[name]
        if self.last is not None and self.last[0] == tensor.name:
            return self.last[1]
        width, rows = (int(n) for n in tensor.shape)  # GGUF lists the fastest dimension first
        decoded = EXACT_DECODERS[tensor.tensor_type.name](tensor.data, rows, width)
        kind, fields = unpermuted(decoded, self.row_heads.get(name))
        if not all(torch.isfinite(part).all() for part in fields if part.is_floating_point()):  # the scales
            raise ValueError(non_finite(tensor.name))
        self.last = tensor.name, (kind, fields)
        return kind, fields

    def __contains__(self, name: object) -> bool:  # Mapping's would decode the tensor, and its caller again
        return name in self.sources

    def __iter__(self) -> Iterator[str]:
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)


# The tensor types read: every type gguf-py dequantizes, as transformers' loader does. A file with any other
# (the integer and F64 types, Q1_0, and llama.cpp's internal Q8_1 and Q8_K) is refused: transformers cannot read it
# either.
READ_TYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
    "MXFP4", "NVFP4",
)  # fmt: skip


def read_gguf_weights(
    path: Path, config: DecoderConfig, exact_types: tuple[str, ...] = ("Q4_K",)
) -> tuple[GGUFTensors, ExactTensors]:
    """The tensors of the GGUF file ``path``: floats, and the linear weights of ``exact_types`` (keys of
    EXACT_DECODERS) as they are stored (the LM head too where it is the embedding: ``gguf_exact.linear_names``), as is
    the embedding of any type in EXACT_DECODERS; each only where its blocks decode exactly
    (``gguf_exact.decodes_exactly``), else as floats.

    A q or k projection whose rows the converter interleaved is kept too, its rows put back in transformers' order
    (``gguf_exact.unpermuted``). Raises ValueError naming the first tensor of a type outside READ_TYPES."""
    gguf = read_gguf(path)
    for tensor in gguf.tensors:
        if tensor.tensor_type.name not in READ_TYPES:
            raise ValueError(
                f"tensor {tensor.name} is stored as {tensor.tensor_type.name}, which the native runtime does not "
                f"read (it reads {', '.join(READ_TYPES)}), nor does transformers"
            )
    floats: dict[str, Any] = {}
    blocks: dict[str, Any] = {}
    row_heads: dict[str, int] = {}
    requantized: dict[str, str] = {}
    tensors = expert_slices(list(gguf.tensors))
    linear = linear_names([tensor.name for tensor in tensors], config.fused_projections, config.tie_word_embeddings)
    sparse = ARCHITECTURES[config.model_type].sparse_mlp
    names = {tensor.name: hf_tensor_name(tensor.name, config.norms, config.fused_projections, sparse)
             for tensor in tensors}  # fmt: skip
    experts = [tensor.name for tensor in tensors
               if isinstance(tensor, ExpertSlice) or shared_expert_weight(tensor.name)]  # fmt: skip
    linear |= {name: names[name] for name in experts}
    unknown = [gguf_name for gguf_name, name in names.items() if name is None and gguf_name not in CONFIG_TENSORS]
    if unknown:  # as llama.cpp refuses them: a misnamed tensor would otherwise leave its weight out silently
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise ValueError(f"the file has tensors that no layer of its architecture reads: {shown}")
    for tensor in tensors:
        name = names[tensor.name]
        if name is None:
            continue
        heads = rotary_row_heads(tensor.name, gguf.architecture, config.num_heads, config.num_kv_heads)
        if heads is not None:
            row_heads[name] = heads
        kept_as = linear.get(tensor.name)  # the linear weight this tensor is, if any
        kept_type = tensor.tensor_type.name in exact_types and kept_as is not None
        wanted = tensor.tensor_type.name in EXACT_DECODERS and (kept_type or name == EMBEDDING)
        exact = wanted and decodes_exactly(tensor)  # checks the blocks of a type only where they would be kept
        if exact and kept_type:
            blocks[kept_as] = tensor
            if kept_as == name:
                continue  # else it is the tied LM head, and the embedding is read below
        elif kept_as is not None:
            requantized[kept_as] = tensor.tensor_type.name
        if name == EMBEDDING and exact:
            blocks[name] = tensor  # rows kept as stored whatever the format: looking them up rounds nothing
            continue
        floats[name] = tensor
    return GGUFTensors(floats, row_heads, requantized), ExactTensors(blocks, row_heads)

"""The native runtime's weights: float (and GGUF K-quant) weights -> packed weight parts, quantized once and cached.

``quantize_state_dict`` turns transformers-named weights into the layout :class:`Decoder` is built from;
``load_native_state`` does it once per model and format and keeps the result in ``$QUICKDRAFT_CACHE/native/``,
so later loads read it back in seconds. A directory quickdraft made from a GGUF file is read from that file
(``gguf_weights``); any other directory from its safetensors files.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Hashable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from quickdraft.errors import ModelFilesError
from quickdraft.models.convert import gguf_source, has_fp32_weights, is_gguf_layout, missing_gguf, read_marker
from quickdraft.progress import progress_bar
from quickdraft.runtime.names import EXACT_TYPES
from quickdraft.runtime.native.architecture import ARCHITECTURES, NATIVE_NORMS, SparseMlp
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.embedding import TokenEmbedding
from quickdraft.runtime.native.entries import ENTRY_SOURCE, drop_superseded, native_cache_dir, note_source
from quickdraft.runtime.native.formats import PART_KINDS
from quickdraft.runtime.native.gguf_blocks import ExactWeight
from quickdraft.runtime.native.gguf_exact import exact_weights
from quickdraft.runtime.native.gguf_weights import EMBEDDING, read_gguf_weights, requantized_note
from quickdraft.runtime.native.linear import QuantizedLinear
from quickdraft.runtime.native.parts import WeightPart


def layer_norm_names(config: DecoderConfig) -> dict[str, str]:
    """A layer's norms: native name -> transformers name (after ``model.layers.{i}.``), those the family has."""
    names = config.norms.named(NATIVE_NORMS)
    if config.qk_norm:
        names |= {"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
    return names


def expert_names(tensors: MutableMapping[str, torch.Tensor], prefix: str, sparse: SparseMlp, experts: int) -> list[str]:
    """A sparse layer's router and then each expert's gate, up and down weights, by the names ``tensors`` holds
    them under: the family's files' (``SparseMlp``), or transformers' in-memory layout (a model's ``state_dict``:
    ``mlp.experts.gate_up_proj [E, 2·I, H]`` and ``down_proj [E, H, I]``), which is split into those names here."""
    router = f"{prefix}{sparse.router}.weight"
    projections = [f"{prefix}{sparse.expert.format(e=e)}.{name}.weight" for e in range(experts)
                   for name in sparse.projections]  # fmt: skip
    fused = f"{prefix}mlp.experts.gate_up_proj"
    if fused in tensors:
        gate_up, down = tensors.pop(fused), tensors.pop(f"{prefix}mlp.experts.down_proj")
        width = gate_up.shape[1] // 2
        tensors[router] = tensors.pop(f"{prefix}mlp.gate.weight")
        for e in range(experts):
            gate, up, down_name = projections[3 * e : 3 * e + 3]
            tensors[gate], tensors[up], tensors[down_name] = gate_up[e, :width], gate_up[e, width:], down[e]
    return [router, *projections]


def quantize_state_dict(
    config: DecoderConfig,
    tensors: MutableMapping[str, torch.Tensor],
    weights: str = "int8",
    exact: Mapping[str, ExactWeight] | None = None,
    norm_offset: float | None = None,
    progress: Any = None,
) -> dict[str, torch.Tensor]:
    """transformers-named float weights -> the native layout, ready to save or build a :class:`Decoder`.

    Linear layers become weight parts (:meth:`QuantizedLinear.state`); q/k/v and gate/up are fused. ``weights``
    is the format float weights are quantized to: ``int8`` (7-bit per channel) or ``q4`` (4-bit in Q4_K's
    structure, round to nearest; ``int8`` where the width is not a multiple of 64). ``exact`` holds weights kept as
    a GGUF file stores them, by name (``gguf_blocks.ExactWeight``): those become parts of their kind as they are, and
    the embedding affine rows (``embedding.py``).
    Norm weights are stored as (offset + w), the offset being the family's (``norm_offset`` None) or the one given
    (0 for GGUF files, which store 1 + w already). ``tensors`` is consumed to keep peak memory low. ``progress``: a
    bar (``progress.progress_bar``) advanced a layer at a time and once for the embedding and LM head, or None.
    """
    exact = {} if exact is None else exact
    offset = config.norm_offset if norm_offset is None else norm_offset
    state: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        return tensors.pop(name).float().contiguous()

    def norm(name: str) -> torch.Tensor:
        return take(name) + offset if offset else take(name)  # float32, as transformers' (1.0 + w.float())

    def source(name: str) -> tuple[tuple[str, bool, Hashable], Any]:  # ((part kind, kept as stored, join key), data)
        if name in exact:
            tensors.pop(name, None)
            kind, fields = exact[name]
            return (kind, True, PART_KINDS[kind].join_key(fields)), fields
        weight = take(name)
        return ("q4" if weights == "q4" and weight.shape[1] % 64 == 0 else "int8", False, None), weight

    def joined(pieces: list[torch.Tensor]) -> torch.Tensor:  # rows concatenated (one piece is not copied)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def part(key: tuple[str, bool, Hashable], items: list[Any]) -> WeightPart:  # consecutive weights of one key, joined
        kind, stored, _ = key
        if stored:
            return PART_KINDS[kind].from_blocks(*(joined(list(field)) for field in zip(*items, strict=True)))
        return PART_KINDS[kind].from_float(joined(items))

    def linear(name: str, weight_names: list[str], biases: list[str] | None = None) -> None:
        sources = [source(weight) for weight in weight_names]
        parts = [part(kind, [item for _, item in run]) for kind, run in itertools.groupby(sources, lambda s: s[0])]
        bias = torch.cat([take(b) for b in biases]) if biases else None
        state.update(QuantizedLinear(parts, bias).state(name))

    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        for native, name in layer_norm_names(config).items():
            state[f"layers.{i}.{native}"] = norm(f"{prefix}{name}.weight")
        projections = ["qkv_proj"] if config.fused_projections else ["q_proj", "k_proj", "v_proj"]
        attention = [f"{prefix}self_attn.{name}" for name in projections]
        linear(
            f"layers.{i}.qkv",
            [f"{name}.weight" for name in attention],
            [f"{name}.bias" for name in attention] if config.attention_bias else None,
        )
        out_bias = f"{prefix}self_attn.o_proj.bias"  # Llama's attention_bias covers o_proj too; Qwen2 has none
        linear(f"layers.{i}.out", [f"{prefix}self_attn.o_proj.weight"], [out_bias] if out_bias in tensors else None)
        sparse = ARCHITECTURES[config.model_type].sparse_mlp
        if config.layer_experts and config.layer_experts[i] and sparse is not None:
            names = expert_names(tensors, prefix, sparse, config.num_experts)
            state[f"layers.{i}.experts.router"] = take(names[0])
            for e in range(config.num_experts):
                gate, up, down = names[1 + 3 * e : 4 + 3 * e]
                linear(f"layers.{i}.experts.{e}.gate_up", [gate, up])
                linear(f"layers.{i}.experts.{e}.down", [down])
            if config.shared_expert_intermediate_size and sparse.shared_expert and sparse.shared_gate:
                state[f"layers.{i}.experts.shared_gate"] = take(f"{prefix}{sparse.shared_gate}.weight").reshape(-1)
                gate, up, down = (f"{prefix}{sparse.shared_expert}.{name}.weight" for name in sparse.projections)
                linear(f"layers.{i}.experts.shared.gate_up", [gate, up])
                linear(f"layers.{i}.experts.shared.down", [down])
        else:
            gate_up = ["gate_up_proj"] if config.fused_projections else ["gate_proj", "up_proj"]
            linear(f"layers.{i}.gate_up", [f"{prefix}mlp.{name}.weight" for name in gate_up])
            linear(f"layers.{i}.down", [f"{prefix}mlp.down_proj.weight"])
        if progress is not None:
            progress.update()
    if EMBEDDING in exact:
        tensors.pop(EMBEDDING, None)
        embedding = TokenEmbedding.from_blocks(*exact[EMBEDDING])
    else:
        embedding = TokenEmbedding(take(EMBEDDING))
    state.update(embedding.state("embedding"))
    if config.tie_word_embeddings and "lm_head.weight" not in exact:
        tensors["lm_head.weight"] = embedding.table()
    linear("lm_head", ["lm_head.weight"])
    if progress is not None:
        progress.update()  # the embedding and the LM head, a step of their own
    state["final_norm"] = norm("model.norm.weight")
    return state


def has_native_weights(path: Path) -> bool:
    """Whether the native runtime finds weights in the directory ``path``: the GGUF file a ``gguf``-layout
    directory names (an fp32 copy beside it is transformers', not a substitute), else safetensors files."""
    return gguf_source(path) is not None if is_gguf_layout(path) else has_fp32_weights(path)


def converted_from(path: Path) -> Path | None:
    """The GGUF file quickdraft converted the fp32 directory ``path`` from (before the ``gguf`` layout), if it is
    still there: its tensors of the kept types are taken where they match the converted weights."""
    marker = read_marker(path)
    source = None if marker is None else Path(str(marker.get("source")))
    return source if source is not None and source.is_file() else None


def missing_weights(path: Path) -> ModelFilesError:
    """The error for a directory without weights the native runtime reads."""
    if is_gguf_layout(path):
        return missing_gguf(path)
    return ModelFilesError(f"{path} has no .safetensors weights for the native runtime")


def quantize_gguf(gguf: Path, config: DecoderConfig, weights: str, progress: Any = None) -> dict[str, torch.Tensor]:
    """The native state of a GGUF file: its tensors of the types ``weights`` keeps (EXACT_TYPES) as they are, the
    rest quantized from the float values transformers' loader gives them. In the auto format, a shown bar
    (``progress``) is preceded by a line naming the linear weights' types stored in 7 bits, if any."""
    tensors, exact = read_gguf_weights(gguf, config, EXACT_TYPES[weights])
    if weights == "auto" and tensors.requantized and progress is not None and not progress.disable:
        progress.write(requantized_note(gguf.name, tensors.requantized), file=sys.stderr)
    quantized = "q4" if weights == "q4" else "int8"
    return quantize_state_dict(config, tensors, quantized, exact, norm_offset=0.0, progress=progress)


def quantize_safetensors(
    path: Path, config: DecoderConfig, weights: str, progress: Any = None
) -> dict[str, torch.Tensor]:
    """The native state of the fp32 weights in ``path`` (and, for a directory converted from a GGUF file before
    the ``gguf`` layout, that file's tensors of the types ``weights`` keeps, where they match)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    if config.tie_word_embeddings and "model.embed_tokens.weight" not in tensors and "lm_head.weight" in tensors:
        tensors["model.embed_tokens.weight"] = tensors.pop("lm_head.weight")  # safetensors kept one name of the two
    check_float_weights(path, tensors, config)
    gguf, tied, kept = converted_from(path), config.tie_word_embeddings, EXACT_TYPES[weights]
    heads, fused = (config.num_heads, config.num_kv_heads), config.fused_projections
    exact = {} if gguf is None or not kept else exact_weights(gguf, tensors, fused, kept, tied, heads)
    return quantize_state_dict(config, tensors, "q4" if weights == "q4" else "int8", exact, progress=progress)


def check_float_weights(path: Path, tensors: dict[str, torch.Tensor], config: DecoderConfig) -> None:
    """A directory's weights say what its config says: no layer past ``num_hidden_layers`` (they would be left out),
    as many embedding rows as ``vocab_size`` (a token past them could be drawn, or one never), the attention's and
    MLP's shapes (:func:`expected_shapes`; else a traceback at the first forward), finite values (as a GGUF file's
    must be); else ``ModelFilesError``."""
    numbers = (name.split(".")[2] for name in tensors if name.startswith("model.layers."))
    layers = {int(number) for number in numbers if number.isdigit()}
    if layers and max(layers) >= config.num_layers:
        message = f"{path}: config.json says {config.num_layers} layers, the weights hold {max(layers) + 1}"
        raise ModelFilesError(message)
    embedding = tensors.get("model.embed_tokens.weight")
    if embedding is not None and embedding.shape[-1] != config.hidden_size:  # the width every other shape follows
        width = embedding.shape[-1]
        raise ModelFilesError(f"{path}: config.json says hidden_size {config.hidden_size}, the weights are {width}")
    if embedding is not None and embedding.shape[0] != config.vocab_size:
        rows = embedding.shape[0]
        raise ModelFilesError(f"{path}: config.json says vocab_size {config.vocab_size}, the embedding has {rows} rows")
    shapes = expected_shapes(config)
    for name, tensor in tensors.items():
        part = name.split(".", 3)[-1] if name.startswith("model.layers.") else ""
        if part in shapes and tuple(tensor.shape) != shapes[part]:
            made = f"the config's sizes make it {list(shapes[part])}"
            raise ModelFilesError(f"{path}: weight {name} is {list(tensor.shape)}, but {made}")
        bounds = torch.aminmax(tensor) if tensor.is_floating_point() and tensor.numel() else ()  # NaN passes through
        if not all(bound.isfinite() for bound in bounds):
            raise ModelFilesError(f"{path}: weight {name} holds NaN or infinite values: the file is damaged")


def expected_shapes(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """A layer's attention and dense MLP weights' shapes ``[out, in]`` by their names after ``model.layers.N.``, as
    the config's sizes make them (fused projections and experts aside)."""
    hidden, query = config.hidden_size, config.num_heads * config.head_dim
    key_value = config.num_kv_heads * config.head_dim
    shapes = {"self_attn.q_proj.weight": (query, hidden), "self_attn.k_proj.weight": (key_value, hidden),
              "self_attn.v_proj.weight": (key_value, hidden), "self_attn.o_proj.weight": (hidden, query)}  # fmt: skip
    if not any(config.layer_experts):
        width = config.intermediate_size
        shapes |= {"mlp.gate_proj.weight": (width, hidden), "mlp.up_proj.weight": (width, hidden),
                   "mlp.down_proj.weight": (hidden, width)}  # fmt: skip
    return shapes


def load_native_state(
    path: Path, config: DecoderConfig, weights: str = "auto", progress: bool = False
) -> dict[str, torch.Tensor]:
    """The quantized weights: from the cache, or quantized from the GGUF file or the float weights and cached
    (``progress``: with a bar on stderr while packing)."""
    from safetensors.torch import load_file, save_file

    if not has_native_weights(path):
        raise missing_weights(path)
    cached = native_cache_dir(path, weights) / "weights.safetensors"
    if cached.is_file():
        try:
            state = load_file(cached)
        except Exception:  # a damaged cache entry (or one another process just replaced) is rebuilt below
            cached.unlink(missing_ok=True)
        else:
            if not (cached.parent / ENTRY_SOURCE).is_file():  # packed before entries had notes
                note_source(cached.parent, path, weights)
            return state
    gguf = gguf_source(path)
    source = path if gguf is None else gguf
    quantize = quantize_safetensors if gguf is None else quantize_gguf
    try:
        with progress_bar(
            total=config.num_layers + 1, desc=f"pack {source.name}", unit="layer", disable=not progress
        ) as bar:
            state = quantize(source, config, weights, bar)
    except KeyError as error:
        raise ModelFilesError(f"{source}: weight {error} is missing") from None
    except ModelFilesError:
        raise
    except Exception as error:  # safetensors and gguf raise several types for damaged files
        raise ModelFilesError(f"cannot load the weights in {source}: {type(error).__name__}: {error}") from error
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".partial")
        save_file(state, partial)
        note_source(cached.parent, path, weights)
        partial.replace(cached)  # atomic: a killed run never leaves a half-written cache entry
    except OSError:
        return state  # a read-only cache only costs the quantization next time
    drop_superseded(cached.parent)
    return state

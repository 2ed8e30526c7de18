"""What a GGUF file says beyond transformers' reading of its config: config.json keys quickdraft adds."""

from __future__ import annotations

from typing import Any

from quickdraft.errors import ModelFilesError
from quickdraft.models.gguf_file import GGUFFile

# YaRN keys of llama.cpp's files that change its RoPE and that quickdraft does not apply, with their neutral values
YARN_UNREAD = {"rope.scaling.yarn_attn_factor": 1.0, "rope.scaling.yarn_ext_factor": 1.0,
               "rope.scaling.yarn_log_multiplier": 0.0}  # fmt: skip
FREQ_FACTORS_KEY = "quickdraft_rope_freq_factors"  # config key for a GGUF file's rope_freqs (no transformers name)
# llama.cpp's Gemma attention scale: its 27B model, known by its layer count, scales the scores by 1/sqrt(the embedding
# width over the heads), every other size by 1/sqrt(the head width); no file says which (transformers' 256 is neither)
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
GEMMA_SOFTCAPS = {  # the softcaps llama.cpp reads by architecture, and its values where a file has none (None: no cap)
    "gemma2": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma3": {"final_logit_softcapping": None},
}
# llama.cpp's rule by architecture where a file with experts does not say whether their weights are renormalized
# (``expert_weights_norm``): its graph builder's
EXPERT_WEIGHTS_NORMALIZED = {"qwen3moe": True, "qwen2moe": False, "olmoe": False}


def gguf_settings(gguf: GGUFFile, config: dict[str, Any]) -> dict[str, Any]:
    """config.json keys for what the GGUF file ``gguf`` says beyond transformers' reading of it: the head width
    (``attention.key_length``; without it, the embedding width over the heads, as llama.cpp takes it, not a
    family's default such as Gemma's 256), RoPE scaling (``rope.scaling.*``: the global layers' where RoPE
    differs by layer type; YaRN's original context and blend bounds, and ``ModelFilesError`` for a YaRN key of
    :data:`YARN_UNREAD` away from its neutral value), the ``rope_freqs`` tensor (Llama 3.1's scaling as llama.cpp
    stores it: :data:`FREQ_FACTORS_KEY`, which the native runtime reads and :func:`apply_freq_factors` puts on
    transformers' model), and Phi-3's: its sliding window, LongRoPE (the
    ``rope_factors_long``/``rope_factors_short`` tensors with ``rope.scaling.original_context_length`` and
    ``rope.scaling.attn_factor``) and partial rotary (``rope.dimension_count`` below the head width); and a mixture
    of experts' width of an expert (``expert_feed_forward_length``) and of its shared expert
    (``expert_shared_feed_forward_length``), and whether the chosen experts' weights are renormalized
    (``expert_weights_norm``, else :data:`EXPERT_WEIGHTS_NORMALIZED`); Gemma 2's and 3's attention scale
    (:data:`GEMMA_27B_LAYERS`) and softcaps (:data:`GEMMA_SOFTCAPS`), which transformers' reader leaves at its own
    defaults."""
    architecture = gguf.architecture

    def field(key: str) -> Any:
        return gguf.fields.get(f"{architecture}.{key}")

    settings: dict[str, Any] = {}
    if (key_length := field("attention.key_length")) is not None:
        settings["head_dim"] = int(key_length)
    elif config.get("hidden_size") and config.get("num_attention_heads"):  # llama.cpp's width when the file gives none
        settings["head_dim"] = int(config["hidden_size"]) // int(config["num_attention_heads"])
    scaling, factor = field("rope.scaling.type"), field("rope.scaling.factor")
    if scaling not in (None, "none") and factor not in (None, 1.0):
        parameters = dict(config.get("rope_parameters") or {})
        scaled = {"rope_type": scaling, "factor": float(factor)}
        if scaling == "yarn":  # the context it was trained for, and the blend's bounds where the file moves them
            yarn = {"original_max_position_embeddings": "rope.scaling.original_context_length",
                    "beta_fast": "rope.scaling.yarn_beta_fast", "beta_slow": "rope.scaling.yarn_beta_slow"}  # fmt: skip
            scaled |= {name: value for name, key in yarn.items() if (value := field(key)) is not None}
            for key, plain in YARN_UNREAD.items():
                if (value := field(key)) is not None and float(value) != plain:
                    unread = f"{architecture}.{key} = {value}, which quickdraft does not read"
                    raise ModelFilesError(f"this GGUF file's YaRN sets {unread}: its RoPE would not be llama.cpp's")
        if isinstance(parameters.get("full_attention"), dict):  # per layer type (Gemma 3): the global layers'
            parameters["full_attention"] = parameters["full_attention"] | scaled
        else:
            parameters |= scaled
        settings["rope_parameters"] = parameters
    tensors = {tensor.name: [float(value) for value in tensor.data] for tensor in gguf.tensors if "rope" in tensor.name}
    if "rope_freqs.weight" in tensors:
        settings[FREQ_FACTORS_KEY] = tensors["rope_freqs.weight"]
    if (expert_width := field("expert_feed_forward_length")) is not None:
        settings["moe_intermediate_size"] = int(expert_width)
    if (shared_width := field("expert_shared_feed_forward_length")) is not None:
        settings["shared_expert_intermediate_size"] = int(shared_width)
    normalized = field("expert_weights_norm")
    if (normalized := EXPERT_WEIGHTS_NORMALIZED.get(architecture) if normalized is None else normalized) is not None:
        settings["norm_topk_prob"] = bool(normalized)
    if architecture == "phi3":
        settings |= phi3_settings(field, tensors, settings.get("head_dim") or config.get("head_dim"), config)
    if architecture in GEMMA_27B_LAYERS:
        settings |= gemma_settings(architecture, field, settings.get("head_dim") or config.get("head_dim"), config)
    return settings


def gemma_settings(architecture: str, field: Any, head_dim: int | None, config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2's and 3's attention scale (``query_pre_attn_scalar``) and softcaps as llama.cpp takes them."""
    per_head = int(config["hidden_size"]) // int(config["num_attention_heads"])
    big = int(config["num_hidden_layers"]) == GEMMA_27B_LAYERS[architecture]
    settings: dict[str, Any] = {"query_pre_attn_scalar": per_head if big else int(head_dim or per_head)}
    for name, default in GEMMA_SOFTCAPS[architecture].items():
        value = default if (value := field(name)) is None else value
        settings[name] = float(value) if value else None  # 0: none, as llama.cpp reads it
    return settings


def phi3_settings(
    field: Any, rope_tensors: dict[str, list[float]], head_dim: int | None, config: dict[str, Any]
) -> dict[str, Any]:
    """The Phi-3 keys transformers' GGUF reader drops, from the file's ``field``s and RoPE tensors."""
    settings: dict[str, Any] = {}
    if window := field("attention.sliding_window"):  # 0: none (Phi-4)
        settings["sliding_window"] = int(window)
    parameters = dict(config.get("rope_parameters") or {})
    head_dim = int(head_dim or config["hidden_size"] // config["num_attention_heads"])
    rotary = field("rope.dimension_count")
    if rotary is not None and 0 < int(rotary) < head_dim:
        parameters["partial_rotary_factor"] = settings["partial_rotary_factor"] = int(rotary) / head_dim
    if "rope_factors_long.weight" in rope_tensors:
        original = int(field("rope.scaling.original_context_length") or config["max_position_embeddings"])
        parameters |= {
            "rope_type": "longrope",
            "long_factor": rope_tensors["rope_factors_long.weight"],
            "short_factor": rope_tensors["rope_factors_short.weight"],
            "original_max_position_embeddings": original,
            "attention_factor": float(field("rope.scaling.attn_factor") or 1.0),
        }
        settings["original_max_position_embeddings"] = original
    if parameters != (config.get("rope_parameters") or {}):
        settings["rope_parameters"] = parameters
    return settings

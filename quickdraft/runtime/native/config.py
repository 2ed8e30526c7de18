"""A native decoder's configuration, read from ``config.json`` with the family's description
(``architecture.ARCHITECTURES``): what the layers compute, per layer where families vary it (RoPE, sliding windows).
For a directory made from a GGUF file, config.json also holds what the file says and transformers' reader leaves
out (``gguf_settings.gguf_settings``: the head width, RoPE scaling, llama.cpp's ``rope_freqs``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quickdraft.models.gguf_settings import FREQ_FACTORS_KEY
from quickdraft.runtime.native.architecture import ACTIVATIONS, ARCHITECTURES, PRE_NORMS, LayerNorms

ROPE_SCALINGS = ("default", "linear", "llama3", "longrope", "yarn")
# A pass of rows through the layers keeps its widest activation (a row's gate and up projections in float32) within
# this: larger ones cost more than reading the weights again (fresh pages from the allocator, activations out of
# cache; docs/design.md has the prompt-reading rates by pass size).
PASS_ACTIVATION_BYTES = 16 * 2**20
MIN_ROWS_PER_PASS = 64


class InvalidConfig(ValueError):
    """A config no model can have (a size below 1, a RoPE base that is not positive): no runtime runs it, unlike a
    family or feature this runtime does not implement."""


SIZES = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size",
         "vocab_size", "head_dim")  # fmt: skip


@dataclass(frozen=True)
class Rope:
    """One RoPE table's parameters: base ``theta`` and a scaling of its frequencies (``linear``: all divided by
    ``factor``; ``llama3``: Llama 3.1's smooth blend between the original and the divided frequencies; ``longrope``:
    Phi-3's per-frequency ``short_factor``, or ``long_factor`` for a cache longer than the original context, as
    llama.cpp chooses by its context size, with cos and sin times ``attention_factor``; ``yarn``: each frequency
    between the original and the divided one by how many turns it makes in the original context, between
    ``beta_slow`` and ``beta_fast``, cos and sin times ``attention_factor``, as transformers computes them).
    ``freq_factors`` (llama.cpp's ``rope_freqs`` tensor) divides each frequency by its own factor instead.
    ``partial_rotary_factor`` < 1 rotates only the first that share of each head's dimensions (Phi-4-mini)."""

    theta: float
    scaling: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple[float, ...] | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    attention_factor: float = 1.0
    partial_rotary_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: the blend's range of dimensions rounded outward to whole dimensions

    def __post_init__(self) -> None:
        if self.scaling not in ROPE_SCALINGS:
            raise ValueError(f"RoPE scaling {self.scaling!r} is not supported (only {', '.join(ROPE_SCALINGS)})")
        if not (self.theta > 0 and self.factor > 0):
            raise InvalidConfig("RoPE needs a positive base and factor")
        if self.scaling == "longrope" and (self.short_factor is None or self.long_factor is None):
            raise ValueError("longrope needs short_factor and long_factor")
        if not 0 < self.partial_rotary_factor <= 1:
            raise InvalidConfig("partial_rotary_factor must be in (0, 1]")

    @classmethod
    def from_hf(cls, parameters: dict[str, Any], theta: float, config: dict[str, Any] | None = None) -> Rope:
        """transformers' ``rope_parameters`` (or the older ``rope_scaling``) with what they omit from ``config``:
        the base ``theta``, Phi-3's original context and partial rotary factor."""
        config = config or {}
        scaling = parameters.get("rope_type", parameters.get("type", "default"))
        original = parameters.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
        factor = parameters.get("factor")
        attention_factor = parameters.get("attention_factor")
        if scaling == "longrope":  # transformers' defaults: factor from the context lengths, then the paper's scale
            factor = factor or int(config.get("max_position_embeddings", original)) / int(original)
            if attention_factor is None:
                attention_factor = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
        if scaling == "yarn":  # transformers' defaults: the original context is the model's, the paper's scale
            original = original or config.get("max_position_embeddings")
            factor = factor or int(config["max_position_embeddings"]) / int(original)
            if attention_factor is None:
                attention_factor = yarn_attention_factor(
                    factor, parameters.get("mscale"), parameters.get("mscale_all_dim")
                )

        def factors(key: str) -> tuple[float, ...] | None:
            return tuple(float(f) for f in parameters[key]) if key in parameters else None

        partial = parameters.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        return cls(
            theta=float(parameters.get("rope_theta", theta)),
            scaling=scaling,
            factor=float(factor or 1.0) if scaling != "default" else 1.0,
            low_freq_factor=float(parameters.get("low_freq_factor", 1.0)),
            high_freq_factor=float(parameters.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(original or 8192),
            short_factor=factors("short_factor"),
            long_factor=factors("long_factor"),
            attention_factor=float(attention_factor or 1.0),
            partial_rotary_factor=float(partial or 1.0),
            beta_fast=float(parameters.get("beta_fast") or 32.0),
            beta_slow=float(parameters.get("beta_slow") or 1.0),
            truncate=bool(parameters.get("truncate", True)),
        )

    def rotary_dims(self, head_dim: int) -> int:
        """How many of a head's dimensions rotate (the first ones; even)."""
        return int(head_dim * self.partial_rotary_factor) // 2 * 2

    def inverse_frequencies(self, head_dim: int, capacity: int = 0) -> torch.Tensor:
        """The rotation speed of each pair of rotating dimensions, float64 ``[R/2]``, as transformers computes it
        (longrope: for a cache of ``capacity`` positions)."""
        dims = self.rotary_dims(head_dim)
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims))
        if self.scaling == "longrope":
            long = capacity > self.original_max_position_embeddings
            return inv_freq / torch.tensor(self.long_factor if long else self.short_factor, dtype=torch.float64)
        if self.freq_factors is not None:
            return inv_freq / torch.tensor(self.freq_factors, dtype=torch.float64)
        if self.scaling == "linear":
            return inv_freq / self.factor
        if self.scaling == "llama3":
            old_context = self.original_max_position_embeddings
            wavelength = 2 * math.pi / inv_freq
            divided = torch.where(wavelength > old_context / self.low_freq_factor, inv_freq / self.factor, inv_freq)
            smooth = (old_context / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
            blended = (1 - smooth) * divided / self.factor + smooth * divided
            high, low = old_context / self.high_freq_factor, old_context / self.low_freq_factor  # wavelengths
            medium = (wavelength >= high) & (wavelength <= low)
            return torch.where(medium, blended, divided)
        if self.scaling == "yarn":
            context = self.original_max_position_embeddings
            low, high = (  # the dimensions that turn beta_fast and beta_slow times in the original context
                dims * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(self.theta))
                for turns in (self.beta_fast, self.beta_slow)
            )
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, dims - 1)
            ramp = ((torch.arange(dims // 2, dtype=torch.float64) - low) / ((high - low) or 0.001)).clamp(0, 1)
            return inv_freq / self.factor * ramp + inv_freq * (1 - ramp)  # kept where fast, divided where slow
        return inv_freq


def yarn_attention_factor(factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    """YaRN's scale of cos and sin (the paper's 0.1 ln s + 1; DeepSeek's ratio of two such where both are given)."""

    def scaled(by: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * by * math.log(factor) + 1.0

    return scaled(mscale) / scaled(mscale_all_dim) if mscale and mscale_all_dim else scaled(1.0)


@dataclass(frozen=True)
class DecoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    layer_ropes: tuple[Rope | None, ...]  # per layer: its RoPE, None for a layer without
    layer_windows: tuple[int, ...]  # per layer: its sliding window (the last W positions), 0 for none
    attention_scale: float  # the scores' factor: 1/sqrt(head_dim), Gemma's 1/sqrt(query_pre_attn_scalar), Granite's own
    qk_norm: bool = False  # q and k RMSNorm'd before RoPE, per head or across heads (the norms' widths say)
    norms: LayerNorms = PRE_NORMS  # which of a layer's norms the family has
    fused_projections: bool = False  # q/k/v and gate/up each one tensor in the model's files
    norm_offset: float = 0.0
    embedding_scale: float = 1.0
    activation: str = "silu"
    final_logit_softcap: float | None = None  # logits = cap · tanh(logits / cap)
    attention_softcap: float | None = None  # attention scores the same (Gemma 2)
    activation_passes: int = 1  # 8-bit passes over the decoder layers' linear inputs (linear.quantize_rows)
    residual_scale: float = 1.0  # each sublayer's output times this before its residual add (Granite's multiplier)
    logits_divisor: float = 1.0  # the LM head's logits over this, before any softcap (Granite's logits_scaling)
    # A mixture of experts (architecture.SparseMlp) in the layers marked True: num_experts gated MLPs of
    # expert_intermediate_size, experts_per_token of them per token, their weights renormalized or not
    layer_experts: tuple[bool, ...] = ()
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    normalize_expert_weights: bool = False
    shared_expert_intermediate_size: int = 0  # a shared expert's width in each sparse layer (0: none)

    def __post_init__(self) -> None:
        if len(self.layer_ropes) != self.num_layers or len(self.layer_windows) != self.num_layers:
            raise ValueError("a RoPE and a window for every layer")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not supported (only {', '.join(ACTIVATIONS)})")
        if self.activation_passes not in (1, 2):
            raise ValueError(f"activations are quantized in 1 or 2 passes, not {self.activation_passes}")
        if self.num_heads % self.num_kv_heads or self.head_dim % 2:
            raise ValueError("query heads must be a multiple of the KV heads, and head_dim even")
        if self.layer_experts and len(self.layer_experts) != self.num_layers:
            raise ValueError("a mixture of experts is marked per layer")
        if any(self.layer_experts) and not (
            1 <= self.experts_per_token <= self.num_experts
            and self.expert_intermediate_size > 0
            and self.shared_expert_intermediate_size >= 0
        ):
            raise ValueError(
                f"a mixture of experts needs 1 to {self.num_experts} experts per token and a positive width, got "
                f"{self.experts_per_token} and {self.expert_intermediate_size}"
            )

    @property
    def rows_per_pass(self) -> int:
        """The most rows one pass through the layers takes: a multiple of 16 (the GEMMs' row tiles), at least
        :data:`MIN_ROWS_PER_PASS`, with the gate and up projections' output within :data:`PASS_ACTIVATION_BYTES`."""
        return max(MIN_ROWS_PER_PASS, PASS_ACTIVATION_BYTES // (2 * self.intermediate_size * 4) // 16 * 16)

    @property
    def rope_theta(self) -> float:
        """The first RoPE layer's base (what reports show)."""
        return next((rope.theta for rope in self.layer_ropes if rope is not None), 10000.0)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> DecoderConfig:
        """Read a transformers ``config.json``; raises ValueError for what this runtime does not support."""
        model_type = config.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"model type {model_type!r} is not one of {sorted(ARCHITECTURES)}")
        family = ARCHITECTURES[model_type]
        if config.get("mlp_bias"):
            raise ValueError("MLP biases are not supported")
        if config.get("clip_qkv") is not None:  # OLMo's clamp of q, k and v (none in released OLMo 2, 3 and OLMoE)
            raise ValueError(f"clip_qkv ({config['clip_qkv']}) is not supported")
        for size in SIZES:
            if config.get(size) is not None and not (isinstance(config[size], int) and config[size] >= 1):
                raise InvalidConfig(f"{size} is {config[size]!r}: a whole number of at least 1")
        num_layers = int(config["num_hidden_layers"])
        num_heads = int(config["num_attention_heads"])
        hidden_size = int(config["hidden_size"])
        head_dim = int(config.get("head_dim") or hidden_size // num_heads)
        layer_types = list(config.get("layer_types") or ["full_attention"] * num_layers)
        window = int(config.get("sliding_window") or 0)
        if family.every_layer_slides_key is not None and config.get(family.every_layer_slides_key):
            layer_types = ["sliding_attention"] * num_layers
        if len(layer_types) != num_layers or not set(layer_types) <= {"full_attention", "sliding_attention"}:
            raise ValueError(f"layer types {sorted(set(layer_types))} are not supported")
        if "sliding_attention" in layer_types and window <= 0:
            raise ValueError("sliding-window layers need a sliding_window")
        with_rope = [bool(flag) for flag in config.get(family.no_rope_key or "") or [1] * num_layers]

        def multiplier(key: str) -> float:  # Granite's scalars; 1 where a family has none
            return float(config.get(key) or 1.0)

        sparse, experts = family.sparse_mlp, int(config.get("num_experts") or config.get("num_local_experts") or 0)
        dense_layers, step = set(config.get("mlp_only_layers") or ()), int(config.get("decoder_sparse_step") or 1)
        layer_experts = tuple(
            sparse is not None and experts > 0 and i not in dense_layers and (i + 1) % step == 0
            for i in range(num_layers)
        )

        return cls(
            model_type=model_type,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", config.get("qkv_bias", family.attention_bias))),
            layer_ropes=tuple(
                layer_rope(config, kind) if rope else None for kind, rope in zip(layer_types, with_rope, strict=True)
            ),
            layer_windows=tuple(window if kind == "sliding_attention" else 0 for kind in layer_types),
            attention_scale=attention_scale(config, head_dim),
            qk_norm=family.qk_norm,
            norms=family.norms,
            fused_projections=family.fused_projections,
            norm_offset=family.norm_offset,
            embedding_scale=math.sqrt(hidden_size) if family.scales_embedding else multiplier("embedding_multiplier"),
            activation=config.get("hidden_activation") or config.get("hidden_act") or family.activation,
            final_logit_softcap=float(softcap) if (softcap := config.get("final_logit_softcapping")) else None,
            attention_softcap=float(cap) if (cap := config.get("attn_logit_softcapping")) else None,
            activation_passes=family.activation_passes,
            residual_scale=multiplier("residual_multiplier"),
            logits_divisor=multiplier("logits_scaling"),
            layer_experts=layer_experts if any(layer_experts) else (),
            num_experts=experts if any(layer_experts) else 0,
            experts_per_token=int(config.get("num_experts_per_tok") or 0) if any(layer_experts) else 0,
            expert_intermediate_size=int(config.get(sparse.width_key) or 0) if sparse and any(layer_experts) else 0,
            normalize_expert_weights=bool(
                sparse and (sparse.normalize_key is None or config.get(sparse.normalize_key))
            ),
            shared_expert_intermediate_size=int(config.get(sparse.shared_width_key) or 0)
            if sparse and sparse.shared_width_key and any(layer_experts)
            else 0,
        )

    @classmethod
    def from_dir(cls, path: Path) -> DecoderConfig:
        """A model directory's config as transformers reads it, so older key names mean what they meant (Gemma 3's
        ``rope_local_base_freq``, sliding windows by ``sliding_window_pattern`` or ``max_window_layers``); the
        file's own keys stand where transformers adds nothing (a family it does not know, keys a GGUF file gave)."""
        written = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return cls.from_hf({**written, **transformers_reading(path)})


def attention_scale(config: dict[str, Any], head_dim: int) -> float:
    """The attention scores' factor: Granite's ``attention_multiplier``, Gemma's 1/sqrt(``query_pre_attn_scalar``),
    or 1/sqrt(head_dim)."""
    if config.get("attention_multiplier"):
        return float(config["attention_multiplier"])
    scalar = config.get("query_pre_attn_scalar")
    return float(scalar) ** -0.5 if scalar else 1.0 / math.sqrt(head_dim)


def transformers_reading(path: Path) -> dict[str, Any]:
    """transformers' reading of ``path``'s config (its current key names), or {} where it cannot read it."""
    try:
        from transformers import AutoConfig
        from transformers.utils import logging

        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # its notes on legacy values it rewrote: the rewrite is what it runs
        try:
            return dict(AutoConfig.from_pretrained(path).to_dict())
        finally:
            logging.set_verbosity(verbosity)
    except Exception:  # an unknown family or a config it refuses: from_hf reads (or refuses) the file itself
        return {}


def layer_rope(config: dict[str, Any], layer_type: str) -> Rope:
    """The RoPE of a layer of ``layer_type``: transformers' per-type parameters (Gemma 3: local and global bases)
    or the model's one set; a GGUF file's ``rope_freqs`` factors apply to the global layers."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(parameters.get(layer_type), dict):
        parameters = parameters[layer_type]
    rope = Rope.from_hf(parameters, float(config.get("rope_theta", 10000.0)), config)
    factors = config.get(FREQ_FACTORS_KEY)
    if factors is not None and layer_type == "full_attention":
        return Rope(theta=rope.theta, freq_factors=tuple(float(f) for f in factors))
    return rope


def rope_tables(rope: Rope | None, head_dim: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[C, R]`` of positions 0..C-1 for the R rotating dimensions of a head (the first R; the rest
    pass unchanged), times the RoPE's attention factor; a layer without RoPE gets cos 1 and sin 0 (x·1 + r·0 = x)."""
    if rope is None:
        return torch.ones(capacity, head_dim), torch.zeros(capacity, head_dim)
    inv_freq = rope.inverse_frequencies(head_dim, capacity)  # [R/2]
    angles = torch.outer(torch.arange(capacity, dtype=torch.float64), inv_freq)  # [C, R/2]
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1) * rope.attention_factor for f in (torch.cos, torch.sin))
    return cos.float(), sin.float()

"""The decoder families the native runtime runs, each described once: what marks it in ``config.json`` and in a
GGUF file, its defaults, its layer's parts, and what llama.cpp stores differently. The config reader
(``config.DecoderConfig``) and the weight loaders (``weights``, ``gguf_weights``) read these descriptions, and the
layers (the PyTorch reference and ``layers.h``) take every difference from the weights and the config they make;
no module tests a family's name. A family is added by describing it here, with whatever its layers need that this
description does not yet say.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SparseMlp:
    """A family's mixture of experts in place of the gated MLP: a router (a linear layer, one logit per expert, kept in
    float32) whose softmax picks each token's ``num_experts_per_tok`` experts, each a gated MLP of its own, their
    outputs weighted by those probabilities (over their sum where the family renormalizes them). A family with a
    shared expert adds one more gated MLP that every token takes, weighted by the sigmoid of its own gate (a linear
    layer of one output, float32 too), after the routed experts. Names are transformers' (after
    ``model.layers.{i}.``; ``{e}`` the expert's number)."""

    router: str  # the router's linear layer
    expert: str  # an expert's prefix
    projections: tuple[str, str, str]  # an expert's gate, up and down projections
    width_key: str  # config.json's intermediate width of an expert
    normalize_key: str | None  # config.json's switch for renormalizing the chosen experts' weights (None: always)
    shared_expert: str | None = None  # the shared expert's prefix (its projections named as an expert's)
    shared_gate: str | None = None  # its gate's linear layer
    shared_width_key: str | None = None  # config.json's intermediate width of the shared expert


@dataclass(frozen=True)
class LayerNorms:
    """A layer's RMSNorms by their transformers names (after ``model.layers.{i}.``), None where the family has none
    (nothing is normed there): the attention's input, the MLP's input, and each sublayer's output before its residual
    add. The native names are ``input_norm``, ``post_norm``, ``attention_out_norm`` and ``mlp_out_norm``; a GGUF file
    calls them ``attn_norm``, ``ffn_norm``, ``post_attention_norm`` and ``post_ffw_norm``."""

    attention_input: str | None = "input_layernorm"
    mlp_input: str | None = "post_attention_layernorm"
    attention_output: str | None = None
    mlp_output: str | None = None

    def named(self, role_names: tuple[str, str, str, str]) -> dict[str, str]:
        """The family's norms: their names in another naming (``role_names``: the four roles' in the order above,
        e.g. :data:`NATIVE_NORMS`) -> transformers names."""
        names = (self.attention_input, self.mlp_input, self.attention_output, self.mlp_output)
        return {role: name for role, name in zip(role_names, names, strict=True) if name is not None}


NATIVE_NORMS = ("input_norm", "post_norm", "attention_out_norm", "mlp_out_norm")  # the native names of the roles


PRE_NORMS = LayerNorms()  # Llama's: each sublayer's input
# Gemma 2 and 3: inputs and outputs, the attention output's norm called post_attention_layernorm
SANDWICH_NORMS = LayerNorms("input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm",
                            "post_feedforward_layernorm")  # fmt: skip
POST_NORMS = LayerNorms(None, None, "post_attention_layernorm", "post_feedforward_layernorm")  # OLMo 2: outputs only


@dataclass(frozen=True)
class Architecture:
    model_type: str  # config.json's
    gguf_architecture: str  # general.architecture in its GGUF files
    attention_bias: bool = False  # q/k/v projections carry biases unless config.json's attention_bias says otherwise
    # config.json's switch for sliding windows on every layer (families that do not list ``layer_types``)
    every_layer_slides_key: str | None = None
    # llama.cpp's converter interleaves the two rotary halves of each head's q and k rows: the loader undoes it
    gguf_interleaves_rotary: bool = False
    # q and k are RMSNorm'd before RoPE: each head (Qwen3, Gemma 3) or all heads as one row (OLMo), as the norms'
    # weights are wide
    qk_norm: bool = False
    norms: LayerNorms = PRE_NORMS
    norm_offset: float = 0.0  # a norm multiplies by (offset + weight): Gemma's 1 + w (GGUF files store 1 + w)
    scales_embedding: bool = False  # token embeddings times sqrt(hidden_size) (Gemma)
    activation: str = "silu"  # the gate's activation when config.json names none
    no_rope_key: str | None = None  # config.json's per-layer list, 0 for layers without RoPE (SmolLM3)
    fused_projections: bool = False  # q/k/v and gate/up stored as one tensor each (Phi-3: qkv_proj, gate_up_proj)
    # 8-bit passes over the decoder layers' linear inputs (linear.quantize_rows): 2 quantizes what the first pass
    # left again, for families whose activations hold outliers that one 8-bit scale per row flattens (Gemma:
    # docs/families.md)
    activation_passes: int = 1
    # a mixture of experts in place of the gated MLP, in the layers config.json makes sparse (mlp_only_layers and
    # decoder_sparse_step where it has them; every layer otherwise)
    sparse_mlp: SparseMlp | None = None


# Qwen's mixtures of experts (Qwen2-MoE adds a shared expert)
QWEN_EXPERTS = SparseMlp(
    "mlp.gate", "mlp.experts.{e}", ("gate_proj", "up_proj", "down_proj"), "moe_intermediate_size", "norm_topk_prob"
)

ARCHITECTURES = {
    family.model_type: family
    for family in (
        Architecture("llama", "llama", gguf_interleaves_rotary=True),
        Architecture("mistral", "llama", every_layer_slides_key="sliding_window", gguf_interleaves_rotary=True),
        Architecture("qwen2", "qwen2", attention_bias=True),
        Architecture("qwen3", "qwen3", qk_norm=True),
        Architecture("qwen3_moe", "qwen3moe", qk_norm=True, sparse_mlp=QWEN_EXPERTS),
        Architecture(
            "qwen2_moe",
            "qwen2moe",
            attention_bias=True,
            sparse_mlp=replace(
                QWEN_EXPERTS,
                shared_expert="mlp.shared_expert",
                shared_gate="mlp.shared_expert_gate",
                shared_width_key="shared_expert_intermediate_size",
            ),
        ),
        Architecture(
            "mixtral",
            "llama",
            every_layer_slides_key="sliding_window",
            gguf_interleaves_rotary=True,
            sparse_mlp=SparseMlp(
                "block_sparse_moe.gate", "block_sparse_moe.experts.{e}", ("w1", "w3", "w2"), "intermediate_size", None
            ),
        ),
        # OLMo 2 and 3: norms of the sublayers' outputs only, q and k normed across all heads; OLMo 3's sliding
        # windows by layer_types. OLMoE: Llama's norms with OLMo's q/k norms, and experts
        Architecture("olmo2", "olmo2", qk_norm=True, norms=POST_NORMS),
        Architecture("olmo3", "olmo2", qk_norm=True, norms=POST_NORMS),
        Architecture(
            "olmoe",
            "olmoe",
            qk_norm=True,
            sparse_mlp=replace(QWEN_EXPERTS, width_key="intermediate_size"),
        ),
        Architecture("smollm3", "smollm3", gguf_interleaves_rotary=True, no_rope_key="no_rope_layers"),
        # Granite: Llama's layers with four scalars, read from its config (config.DecoderConfig.from_hf)
        Architecture("granite", "granite", gguf_interleaves_rotary=True),
        Architecture("phi3", "phi3", every_layer_slides_key="sliding_window", fused_projections=True),
        Architecture(
            "gemma",
            "gemma",
            norm_offset=1.0,
            scales_embedding=True,
            activation="gelu_pytorch_tanh",
            activation_passes=2,
        ),
        Architecture(
            "gemma2",
            "gemma2",
            norms=SANDWICH_NORMS,
            norm_offset=1.0,
            scales_embedding=True,
            activation="gelu_pytorch_tanh",
            activation_passes=2,
        ),
        Architecture(
            "gemma3_text",
            "gemma3",
            qk_norm=True,
            norms=SANDWICH_NORMS,
            norm_offset=1.0,
            scales_embedding=True,
            activation="gelu_pytorch_tanh",
            activation_passes=2,
        ),
    )
}
# GGUF architectures whose q and k rows come interleaved (those of the families above that say so)
GGUF_INTERLEAVED_ROTARY = frozenset(a.gguf_architecture for a in ARCHITECTURES.values() if a.gguf_interleaves_rotary)
# Gated MLP activations by config.json's name -> the kernels' code (kernels.cpp's Activation)
ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu_tanh": 1, "gelu": 2}

"""A decoder layer's weights, as the native weight cache holds them and as ``layers.h`` takes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.experts import Experts
from quickdraft.runtime.native.linear import QuantizedLinear

# The gate's activation by the kernels' code (architecture.ACTIVATIONS): the reference path's, in PyTorch operations
ACTIVATION_FUNCTIONS = {
    0: torch.nn.functional.silu,
    1: lambda gate: torch.nn.functional.gelu(gate, approximate="tanh"),
    2: torch.nn.functional.gelu,
}


@dataclass
class DecoderLayer:
    """A layer's weights; the norms are (offset + w) already, and empty where a family has none (no norm there);
    a layer with ``experts`` has no ``gate_up`` and ``down`` of its own."""

    input_norm: torch.Tensor  # [H] or empty: the attention's input norm
    qkv: QuantizedLinear  # H -> (heads + 2·kv_heads)·head_dim
    out: QuantizedLinear  # heads·head_dim -> H (with a bias when the model has attention biases and o_proj has one)
    post_norm: torch.Tensor  # [H] or empty: the MLP's input norm
    gate_up: QuantizedLinear | None  # H -> 2·intermediate
    down: QuantizedLinear | None  # intermediate -> H
    q_norm: torch.Tensor  # [D], [heads·D] or empty: q's RMSNorm before RoPE, per head or across heads (k_norm: k's)
    k_norm: torch.Tensor
    attention_out_norm: torch.Tensor  # [H] or empty: the attention's output normed before its residual add
    mlp_out_norm: torch.Tensor  # [H] or empty: the MLP's output, the same
    window: int = 0  # the sliding window (0: none)
    experts: Experts | None = None  # a mixture of experts in place of the gated MLP

    @classmethod
    def from_state(cls, config: DecoderConfig, state: dict[str, torch.Tensor], i: int) -> DecoderLayer:
        """Layer ``i`` of :func:`quantize_state_dict`'s layout (packed weight parts, float norms and biases)."""

        def linear(name: str) -> QuantizedLinear:
            return QuantizedLinear.from_state(f"layers.{i}.{name}", state, config.activation_passes)

        def optional(name: str) -> torch.Tensor:
            return state.get(f"layers.{i}.{name}", torch.empty(0))

        sparse = bool(config.layer_experts) and config.layer_experts[i]
        top_k, normalize, passes = config.experts_per_token, config.normalize_expert_weights, config.activation_passes
        return cls(
            input_norm=optional("input_norm"),
            qkv=linear("qkv"),
            out=linear("out"),
            post_norm=optional("post_norm"),
            gate_up=None if sparse else linear("gate_up"),
            down=None if sparse else linear("down"),
            q_norm=optional("q_norm"),
            k_norm=optional("k_norm"),
            attention_out_norm=optional("attention_out_norm"),
            mlp_out_norm=optional("mlp_out_norm"),
            window=config.layer_windows[i],
            experts=Experts.from_state(f"layers.{i}.experts", state, passes, top_k, normalize) if sparse else None,
        )

    def kernel_spec(self, kernels: Any, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        """This layer as ``layers.h``'s Layer, with its RoPE tables ``[C, D]``; a layer of experts passes empty
        gate/up and down layers."""
        empty = torch.empty(0)
        gate_up, down = (
            kernels.Linear([], 0, empty, empty) if linear is None else linear.kernel_spec(kernels)
            for linear in (self.gate_up, self.down)
        )
        return kernels.Layer(
            self.input_norm,
            self.post_norm,
            self.q_norm,
            self.k_norm,
            self.attention_out_norm,
            self.mlp_out_norm,
            self.qkv.kernel_spec(kernels),
            self.out.kernel_spec(kernels),
            gate_up,
            down,
            cos,
            sin,
            self.window,
            kernels.Experts() if self.experts is None else self.experts.kernel_spec(kernels),
        )

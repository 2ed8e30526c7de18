"""A Llama-family decoder (Llama, Qwen2, Mistral without sliding windows) written for bit-exactness.

Every operation gives a token's row the same bits whatever else is in the call:
- linear layers are :class:`Int8Linear` (exact integer GEMM, per-row activation scales);
- RMSNorm, RoPE, SiLU and residual adds are row-wise or element-wise;
- attention runs query by query: the query at position p attends to exactly p + 1 cached
  keys with the same shapes and strides whether it comes alone (decode), inside a verify block
  at any offset, or again after a rollback.
So a position's logits are bitwise identical in a 1-token step and in a k-token block, which
makes greedy speculative decoding equal to greedy decoding by construction.

A layer runs as 12 calls of the compiled kernels (:meth:`Decoder._fused_layer`) or, when they
cannot be built, as PyTorch operations (:meth:`Decoder._layer`, the readable reference the tests
compare the kernels with). Both are row-wise; their bits differ only in RMSNorm's sum and SiLU's exp.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.linear import Int8Linear, quantize_weight

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})


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
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> DecoderConfig:
        """Read a transformers ``config.json``; raises ValueError for what this runtime does not support."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model type {model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"RoPE scaling {rope_type!r} is not supported")
        if config.get("use_sliding_window") or (model_type == "mistral" and config.get("sliding_window")):
            raise ValueError("sliding-window attention is not supported")
        if config.get("mlp_bias"):
            raise ValueError("MLP biases are not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"activation {config.get('hidden_act')!r} is not supported")
        num_heads = int(config["num_attention_heads"])
        hidden_size = int(config["hidden_size"])
        return cls(
            model_type=model_type,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or hidden_size // num_heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        )

    @classmethod
    def from_dir(cls, path: Path) -> DecoderConfig:
        return cls.from_hf(json.loads((path / "config.json").read_text(encoding="utf-8")))


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor  # [H]
    qkv: Int8Linear  # H -> (heads + 2·kv_heads)·head_dim
    out: Int8Linear  # heads·head_dim -> H (with a bias when the model has attention biases and o_proj has one)
    post_norm: torch.Tensor  # [H]
    gate_up: Int8Linear  # H -> 2·intermediate
    down: Int8Linear  # intermediate -> H


class StaticKVCache:
    """Preallocated keys and values ``[layers, B, kv_heads, capacity, head_dim]``; rollback moves a length.

    A row's positions at or past its length are never read (a query at position p attends to 0..p,
    all written before it), so the tensors start uninitialized: the memory of positions no token
    reaches is never touched. Zeroing 8192 positions of the 1.5B target took 0.11 s per request and
    freeing them 0.18 s.
    """

    def __init__(self, config: DecoderConfig, batch_size: int, capacity: int) -> None:
        shape = (config.num_layers, batch_size, config.num_kv_heads, capacity, config.head_dim)
        self.keys = torch.empty(shape)
        self.values = torch.empty(shape)
        self.lengths = torch.zeros(batch_size, dtype=torch.long)  # [B]
        self.capacity = capacity


class Decoder:
    """Weights plus ``forward(token_ids, cache)``; see the module docstring for why it is bit-exact."""

    def __init__(
        self,
        config: DecoderConfig,
        embedding: torch.Tensor,
        layers: list[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: Int8Linear,
        capacity: int,
    ) -> None:
        self.config = config
        self.embedding = embedding  # [V, H] float32
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.capacity = capacity
        half = config.head_dim // 2
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, half, dtype=torch.float64) * 2 / config.head_dim))
        angles = torch.outer(torch.arange(capacity, dtype=torch.float64), inv_freq)  # [C, D/2]
        self.rope_cos = torch.cat([angles.cos(), angles.cos()], dim=-1).float()  # [C, D]
        self.rope_sin = torch.cat([angles.sin(), angles.sin()], dim=-1).float()  # [C, D]
        self.attention_scale = 1.0 / math.sqrt(config.head_dim)
        self.use_kernel = True  # the compiled kernels when they build (False: the PyTorch reference path)

    @classmethod
    def from_native_state(cls, config: DecoderConfig, state: dict[str, torch.Tensor], capacity: int) -> Decoder:
        """Build from :func:`quantize_state_dict`'s layout (int8 weights, scales, float norms and biases)."""

        def linear(name: str) -> Int8Linear:
            return Int8Linear(state[f"{name}.weight"], state[f"{name}.scale"], state.get(f"{name}.bias"))

        layers = [
            DecoderLayer(
                input_norm=state[f"layers.{i}.input_norm"],
                qkv=linear(f"layers.{i}.qkv"),
                out=linear(f"layers.{i}.out"),
                post_norm=state[f"layers.{i}.post_norm"],
                gate_up=linear(f"layers.{i}.gate_up"),
                down=linear(f"layers.{i}.down"),
            )
            for i in range(config.num_layers)
        ]
        return cls(config, state["embedding"], layers, state["final_norm"], linear("lm_head"), capacity)

    def new_cache(self, batch_size: int) -> StaticKVCache:
        return StaticKVCache(self.config, batch_size, self.capacity)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return weight * (x * torch.rsqrt(variance + self.config.rms_norm_eps))

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, starts: list[int]) -> torch.Tensor:
        """Causal attention of ``q [B, K, heads, D]`` over the cache, query by query -> ``[B, K, heads·D]``."""
        if self.use_kernel and (kernel := native_kernels()) is not None:
            return kernel.attend(q, keys, values, starts, self.attention_scale)
        batch, num_new, heads, head_dim = q.shape
        kv_heads = keys.shape[1]
        attended = torch.empty(batch, num_new, heads * head_dim)
        for row, start in enumerate(starts):
            for i in range(num_new):
                length = start + i + 1  # the query at position start + i sees positions 0 .. start + i
                query = q[row, i].reshape(kv_heads, heads // kv_heads, head_dim) * self.attention_scale
                scores = torch.matmul(query, keys[row, :, :length].transpose(-1, -2))  # [kv, G, length]
                weights = torch.softmax(scores, dim=-1)
                attended[row, i] = torch.matmul(weights, values[row, :, :length]).reshape(-1)  # [heads·D]
        return attended

    def _layer(
        self,
        layer: DecoderLayer,
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        starts: list[int],
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """One decoder layer in PyTorch operations: ``x [B, K, H]`` -> ``[B, K, H]``, keys and values cached."""
        batch, num_new, _ = x.shape
        heads, kv_heads, head_dim = self.config.num_heads, self.config.num_kv_heads, self.config.head_dim
        qkv = layer.qkv(self._rms_norm(x, layer.input_norm))  # [B, K, (heads + 2·kv_heads)·D]
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = self._rotate(q.reshape(batch, num_new, heads, head_dim), cos, sin)  # [B, K, heads, D]
        k = self._rotate(k.reshape(batch, num_new, kv_heads, head_dim), cos, sin)  # [B, K, kv_heads, D]
        v = v.reshape(batch, num_new, kv_heads, head_dim)
        for row, start in enumerate(starts):
            keys[row, :, start : start + num_new] = k[row].transpose(0, 1)
            values[row, :, start : start + num_new] = v[row].transpose(0, 1)
        x = x + layer.out(self._attend(q, keys, values, starts))
        gate, up = layer.gate_up(self._rms_norm(x, layer.post_norm)).chunk(2, dim=-1)  # [B, K, I] each
        return x + layer.down(torch.nn.functional.silu(gate) * up)

    def _fused_layer(
        self,
        kernels: Any,
        layer: DecoderLayer,
        x: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        starts: list[int],
    ) -> torch.Tensor:
        """:meth:`_layer` as 12 kernel calls (4 of them the integer GEMMs): ``x [B·K, H]`` -> ``[B·K, H]``."""
        eps = self.config.rms_norm_eps
        # rows: quantized activations [B·K + 1, width] with fbgemm's sentinel last; row_scale [B·K, 1]
        rows, row_scale = kernels.rms_norm_quantize(x, layer.input_norm, eps)
        q = kernels.qkv_rope_cache(
            layer.qkv.matmul_rows(rows),
            row_scale,
            layer.qkv.kernel_bias,
            self.rope_cos,
            self.rope_sin,
            keys,
            values,
            starts,
            self.config.num_heads,
        )  # [B, K, heads, D]; k and v went into the cache
        attended = kernels.attend(q, keys, values, starts, self.attention_scale)  # [B, K, heads·D]
        rows, row_scale = kernels.quantize_rows(attended.reshape(x.shape[0], -1))
        x = kernels.combine_residual(layer.out.matmul_rows(rows), row_scale, layer.out.kernel_bias, x)  # [B·K, H]
        rows, row_scale = kernels.rms_norm_quantize(x, layer.post_norm, eps)
        rows, row_scale = kernels.silu_mul_quantize(layer.gate_up.matmul_rows(rows), row_scale)  # [B·K + 1, I]
        return kernels.combine_residual(layer.down.matmul_rows(rows), row_scale, layer.down.kernel_bias, x)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        cache: StaticKVCache,
        last_only: bool = False,
        exit_layer: int | None = None,
        starts: list[int] | None = None,
        return_hidden: bool = False,
    ) -> Any:
        """Append ``token_ids [B, K]`` to ``cache``; float32 logits ``[B, K, V]`` (``[B, 1, V]`` if last_only).

        ``exit_layer = L`` runs only the first L layers, then the final norm and LM head (self-speculative
        drafting): it writes those layers' keys and values at positions ``starts`` onwards and leaves the
        cache's lengths alone, so the next full forward over the same positions overwrites them.
        ``return_hidden`` also returns the hidden state after the final norm, ``[B, K or 1, H]``.
        """
        batch, num_new = token_ids.shape
        if starts is None:
            starts = cache.lengths.tolist()
        if max(starts) + num_new > cache.capacity:
            raise ValueError(f"the cache holds {cache.capacity} positions; {max(starts) + num_new} needed")
        kernels = native_kernels() if self.use_kernel else None
        layers = list(enumerate(self.layers[:exit_layer]))  # keys and values of layer i: cache.keys[i]
        x = self.embedding[token_ids]  # [B, K, H]
        if kernels is not None:
            x = x.reshape(batch * num_new, -1)  # [B·K, H]
            for index, layer in layers:
                x = self._fused_layer(kernels, layer, x, cache.keys[index], cache.values[index], starts)
            x = x.reshape(batch, num_new, -1)  # [B, K, H]
        else:
            positions = torch.tensor(starts)[:, None] + torch.arange(num_new)  # [B, K]
            cos, sin = self.rope_cos[positions][:, :, None], self.rope_sin[positions][:, :, None]  # [B, K, 1, D]
            for index, layer in layers:
                x = self._layer(layer, x, cache.keys[index], cache.values[index], starts, cos, sin)
        if exit_layer is None:
            cache.lengths += num_new
        if last_only:
            x = x[:, -1:]
        if kernels is not None:
            hidden = kernels.rms_norm(x.reshape(-1, x.shape[-1]), self.final_norm, self.config.rms_norm_eps)
            hidden = hidden.reshape(x.shape)  # [B, K or 1, H]
        else:
            hidden = self._rms_norm(x, self.final_norm)  # [B, K or 1, H]
        logits = self.lm_head(hidden)  # [B, K or 1, V]
        return (logits, hidden) if return_hidden else logits


def quantize_state_dict(config: DecoderConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers-named float weights -> the native layout, ready to save or build a :class:`Decoder`.

    Linear layers become ``NAME.weight`` (int8 holding 7-bit values, per-output-channel symmetric), ``NAME.scale`` and
    ``NAME.bias``; q/k/v and gate/up are fused. ``tensors`` is consumed to keep peak memory low.
    """
    state: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        return tensors.pop(name).float().contiguous()

    def linear(name: str, weights: list[str], biases: list[str] | None = None) -> None:
        weight_int8, scale = quantize_weight(torch.cat([take(w) for w in weights]))
        state[f"{name}.weight"], state[f"{name}.scale"] = weight_int8, scale
        if biases:
            state[f"{name}.bias"] = torch.cat([take(b) for b in biases])

    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        attention = [f"{prefix}self_attn.{p}_proj" for p in "qkv"]
        state[f"layers.{i}.input_norm"] = take(f"{prefix}input_layernorm.weight")
        linear(
            f"layers.{i}.qkv",
            [f"{name}.weight" for name in attention],
            [f"{name}.bias" for name in attention] if config.attention_bias else None,
        )
        out_bias = f"{prefix}self_attn.o_proj.bias"  # Llama's attention_bias covers o_proj too; Qwen2 has none
        linear(f"layers.{i}.out", [f"{prefix}self_attn.o_proj.weight"], [out_bias] if out_bias in tensors else None)
        state[f"layers.{i}.post_norm"] = take(f"{prefix}post_attention_layernorm.weight")
        linear(f"layers.{i}.gate_up", [f"{prefix}mlp.gate_proj.weight", f"{prefix}mlp.up_proj.weight"])
        linear(f"layers.{i}.down", [f"{prefix}mlp.down_proj.weight"])
    state["embedding"] = take("model.embed_tokens.weight")
    if config.tie_word_embeddings:
        state["lm_head.weight"], state["lm_head.scale"] = quantize_weight(state["embedding"])
    else:
        linear("lm_head", ["lm_head.weight"])
    state["final_norm"] = take("model.norm.weight")
    return state

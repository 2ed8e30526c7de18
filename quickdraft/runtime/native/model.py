"""A Llama-family decoder (Llama, Qwen2, Mistral without sliding windows) written for bit-exactness.

Every operation gives a token's row the same bits whatever else is in the call:
- linear layers are :class:`QuantizedLinear` (exact integer GEMMs, per-row activation scales);
- RMSNorm, RoPE, SiLU and residual adds are row-wise or element-wise;
- attention runs query by query: the query at position p attends to exactly p + 1 cached
  keys with the same shapes and strides whether it comes alone (decode), inside a verify block
  at any offset, or again after a rollback.
So a position's logits are bitwise identical in a 1-token step and in a k-token block, which
makes greedy speculative decoding equal to greedy decoding by construction.

The layers run as one call of the compiled kernels (``layers.cpp``: a layer's steps between its GEMMs
fused into 8 kernels) or, when they cannot be built, as PyTorch operations (:meth:`Decoder._layer`, the
readable reference the tests compare the kernels with). Both are row-wise; their bits differ only in
RMSNorm's sum, attention's dot products, sums and exp, and SiLU's exp.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quickdraft.runtime.native.architecture import ARCHITECTURES
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.linear import QuantizedLinear

Slots = list[torch.Tensor]  # per cache slot (a request's row), its keys or values (StaticKVCache.slots)


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
        if model_type not in ARCHITECTURES:
            raise ValueError(f"model type {model_type!r} is not one of {sorted(ARCHITECTURES)}")
        family = ARCHITECTURES[model_type]
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"RoPE scaling {rope_type!r} is not supported")
        if any(config.get(key) for key in family.sliding_window_keys):
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
            attention_bias=bool(config.get("attention_bias", family.attention_bias)),
        )

    @classmethod
    def from_dir(cls, path: Path) -> DecoderConfig:
        return cls.from_hf(json.loads((path / "config.json").read_text(encoding="utf-8")))


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor  # [H]
    qkv: QuantizedLinear  # H -> (heads + 2·kv_heads)·head_dim
    out: QuantizedLinear  # heads·head_dim -> H (with a bias when the model has attention biases and o_proj has one)
    post_norm: torch.Tensor  # [H]
    gate_up: QuantizedLinear  # H -> 2·intermediate
    down: QuantizedLinear  # intermediate -> H


KEY_BLOCK = 16  # keys are kept in blocks of 16 positions, transposed (attention.h)


class StaticKVCache:
    """Preallocated keys ``[layers, B, kv_heads, C/16, head_dim, 16]`` (blocks of 16 positions, transposed) and values
    ``[layers, B, kv_heads, C, head_dim]``; rollback moves a length.

    A row's positions at or past its length are never read (a query at position p attends to 0..p,
    all written before it), so the tensors start uninitialized: the memory of positions no token
    reaches is never touched. Zeroing 8192 positions of the 1.5B target took 0.11 s per request and
    freeing them 0.18 s.
    """

    def __init__(self, config: DecoderConfig, batch_size: int, capacity: int) -> None:
        blocks = -(-capacity // KEY_BLOCK)
        prefix = (config.num_layers, batch_size, config.num_kv_heads)
        self.keys = torch.empty(*prefix, blocks, config.head_dim, KEY_BLOCK)
        self.values = torch.empty(*prefix, blocks * KEY_BLOCK, config.head_dim)
        self.lengths = torch.zeros(batch_size, dtype=torch.long)  # [B]
        self.capacity = capacity

    def slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each row's keys ``[layers, kv_heads, C/16, D, 16]`` and values ``[layers, kv_heads, C, D]`` (views: what the
        kernels address by slot)."""
        rows = range(self.keys.shape[1])
        return [self.keys[:, row] for row in rows], [self.values[:, row] for row in rows]


def key_rows(keys: torch.Tensor, length: int) -> torch.Tensor:
    """One layer's blocked keys ``[kv_heads, C/16, D, 16]`` -> positions 0..length-1, ``[kv_heads, length, D]``."""
    kv_heads, blocks, head_dim, _ = keys.shape
    return keys.transpose(-1, -2).reshape(kv_heads, blocks * KEY_BLOCK, head_dim)[:, :length]


class Decoder:
    """Weights plus ``forward(token_ids, cache)``; see the module docstring for why it is bit-exact."""

    def __init__(
        self,
        config: DecoderConfig,
        embedding: torch.Tensor,
        layers: list[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: QuantizedLinear,
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
        self.vocabulary: torch.Tensor | None = None  # the token ids the LM head computes (None: all)
        self.all_rows_head = lm_head  # the LM head over every token (a restricted one selects from it)
        self.focus: torch.Tensor = torch.empty(0, dtype=torch.long)  # tokens computed beside the vocabulary
        self.focus_head: Any = None  # the LM head over them (None: no focus)
        self._layers_spec: Any = None  # the compiled layer loop, built on first use

    @classmethod
    def from_native_state(cls, config: DecoderConfig, state: dict[str, torch.Tensor], capacity: int) -> Decoder:
        """Build from :func:`quantize_state_dict`'s layout (packed weight parts, float norms and biases)."""

        def linear(name: str) -> QuantizedLinear:
            return QuantizedLinear.from_state(name, state)

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

    def _attend(
        self, index: int, q: torch.Tensor, keys: Slots, values: Slots, row_slot: list[int], row_position: list[int]
    ) -> torch.Tensor:
        """Causal attention of ``q [R, heads, D]`` over layer ``index`` of the rows' cache slots -> ``[R, heads·D]``;
        row r is position ``row_position[r]`` of slot ``row_slot[r]`` and sees that slot's positions 0 ..
        row_position[r]."""
        if self.use_kernel and (kernel := native_kernels()) is not None:
            return kernel.attend(q, keys, values, index, row_slot, row_position, self.attention_scale)
        rows, heads, head_dim = q.shape
        attended = torch.empty(rows, heads * head_dim)
        for r, (slot, position) in enumerate(zip(row_slot, row_position, strict=True)):
            slot_keys, slot_values = key_rows(keys[slot][index], position + 1), values[slot][index, :, : position + 1]
            kv_heads = slot_keys.shape[0]
            query = q[r].reshape(kv_heads, heads // kv_heads, head_dim) * self.attention_scale
            scores = torch.matmul(query, slot_keys.transpose(-1, -2))  # [kv, G, position + 1]
            weights = torch.softmax(scores, dim=-1)
            attended[r] = torch.matmul(weights, slot_values).reshape(-1)  # [heads·D]
        return attended

    def _layer(
        self,
        index: int,
        layer: DecoderLayer,
        x: torch.Tensor,
        keys: Slots,
        values: Slots,
        row_slot: list[int],
        row_position: list[int],
    ) -> torch.Tensor:
        """Decoder layer ``index`` in PyTorch operations: ``x [R, H]`` -> ``[R, H]``; rows' keys and values cached."""
        rows = x.shape[0]
        heads, kv_heads, head_dim = self.config.num_heads, self.config.num_kv_heads, self.config.head_dim
        positions = torch.tensor(row_position)
        cos, sin = self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]  # [R, 1, D]
        qkv = layer.qkv(self._rms_norm(x, layer.input_norm))  # [R, (heads + 2·kv_heads)·D]
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = self._rotate(q.reshape(rows, heads, head_dim), cos, sin)  # [R, heads, D]
        k = self._rotate(k.reshape(rows, kv_heads, head_dim), cos, sin)  # [R, kv_heads, D]
        v = v.reshape(rows, kv_heads, head_dim)
        for r, (slot, position) in enumerate(zip(row_slot, row_position, strict=True)):
            keys[slot][index, :, position // KEY_BLOCK, :, position % KEY_BLOCK] = k[r]
            values[slot][index, :, position] = v[r]
        x = x + layer.out(self._attend(index, q, keys, values, row_slot, row_position))
        gate, up = layer.gate_up(self._rms_norm(x, layer.post_norm)).chunk(2, dim=-1)  # [R, I] each
        return x + layer.down(torch.nn.functional.silu(gate) * up)

    def _decode_rows(
        self,
        token_ids: torch.Tensor,
        keys: Slots,
        values: Slots,
        row_slot: list[int],
        row_position: list[int],
        exit_layer: int | None = None,
        capture: Sequence[int] = (),
    ) -> list[torch.Tensor]:
        """The decoder layers (the first ``exit_layer`` of them) over rows of new tokens ``token_ids [R]``; row r is
        position ``row_position[r]`` of cache slot ``row_slot[r]`` (``keys[s]``, ``values[s]``: that slot's, from
        :meth:`StaticKVCache.slots`). Writes the rows' keys and values; returns the hidden states ``[R, H]`` after
        each layer count in ``capture`` (ascending), then after the last layer, all before the final norm."""
        if max(row_position) >= self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {max(row_position) + 1} needed")
        layers = self.layers[:exit_layer]
        if list(capture) != sorted(set(capture)) or not all(1 <= count <= len(layers) for count in capture):
            raise ValueError(f"capture names ascending layer counts in 1..{len(layers)}, got {list(capture)}")
        x = self.embedding[token_ids]  # [R, H]
        if self.use_kernel and (kernels := native_kernels()) is not None:  # the same operations, in one call
            compiled = self._compiled_layers(kernels)
            return compiled.forward(x, keys, values, row_slot, row_position, len(layers), list(capture))
        captured = []
        for index, layer in enumerate(layers):
            x = self._layer(index, layer, x, keys, values, row_slot, row_position)
            if index + 1 in capture:
                captured.append(x)
        return [*captured, x]

    def _compiled_layers(self, kernels: Any) -> Any:
        """The layers as ``layers.cpp`` runs them: :meth:`_layer`'s steps as fused kernels, in one call."""
        if self._layers_spec is None:
            specs = [
                kernels.Layer(
                    layer.input_norm,
                    layer.post_norm,
                    *(linear.kernel_spec(kernels) for linear in (layer.qkv, layer.out, layer.gate_up, layer.down)),
                )
                for layer in self.layers
            ]
            config = self.config
            self._layers_spec = kernels.Layers(
                specs, self.rope_cos, self.rope_sin, config.num_heads, config.rms_norm_eps, self.attention_scale
            )
        return self._layers_spec

    def restrict_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Compute logits for ``token_ids`` only (FR-Spec: a draft model's LM head over the frequent tokens, a large
        share of its step); every other token gets logit −inf, probability 0. Each kept logit keeps its bits."""
        self.vocabulary = torch.unique(token_ids)  # sorted
        self.lm_head = self.all_rows_head.select_rows(self.vocabulary)
        self.focus_vocabulary(torch.empty(0, dtype=torch.long))

    def focus_vocabulary(self, token_ids: torch.Tensor) -> None:
        """With a restricted vocabulary, also compute logits for ``token_ids`` (a request's prompt: an answer
        repeats its prompt's rare words, names, code identifiers), replacing the previous focus; bit for bit the
        logits the whole LM head gives them. Without a restriction every token is computed already."""
        if self.vocabulary is None:
            return
        token_ids = torch.unique(token_ids[(token_ids >= 0) & (token_ids < self.config.vocab_size)])
        focus = token_ids[~torch.isin(token_ids, self.vocabulary)]  # sorted
        if torch.equal(focus, self.focus):
            return
        self.focus = focus
        self.focus_head = self.all_rows_head.select_rows(focus) if len(focus) else None

    def _head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final norm and LM head: hidden ``x [R, H]`` -> (logits ``[R, V]``, normed hidden ``[R, H]``)."""
        if self.use_kernel and (kernels := native_kernels()) is not None:
            hidden = kernels.rms_norm(x, self.final_norm, self.config.rms_norm_eps)
        else:
            hidden = self._rms_norm(x, self.final_norm)
        logits = self.lm_head(hidden)  # [R, V] or [R, |vocabulary|]
        if self.vocabulary is None:
            return logits, hidden
        full = torch.full((x.shape[0], self.config.vocab_size), -torch.inf)
        full[:, self.vocabulary] = logits
        if self.focus_head is not None:
            full[:, self.focus] = self.focus_head(hidden)  # [R, |focus|]
        return full, hidden

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
        row_slot = [row for row in range(batch) for _ in range(num_new)]
        row_position = [start + i for start in starts for i in range(num_new)]
        keys, values = cache.slots()
        x = self._decode_rows(token_ids.reshape(-1), keys, values, row_slot, row_position, exit_layer)[-1]
        if exit_layer is None:
            cache.lengths += num_new
        x = x.reshape(batch, num_new, -1)
        if last_only:
            x = x[:, -1:]
        logits, hidden = self._head(x.reshape(-1, x.shape[-1]))
        logits, hidden = logits.reshape(*x.shape[:2], -1), hidden.reshape(x.shape)  # [B, K or 1, V], [B, K or 1, H]
        return (logits, hidden) if return_hidden else logits

    @torch.inference_mode()
    def forward_rows(
        self, requests: Sequence[tuple[StaticKVCache, list[int], bool]], capture: Sequence[int] = ()
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """One forward over several caches' new tokens, their rows side by side in every GEMM.

        ``requests``: (cache of one row, its new token ids, last_only). Returns per request its logits ``[K, V]``
        (``[1, V]`` if last_only) and its normed hidden states ``[K or 1, H]``: bitwise what :meth:`forward`
        gives the same cache and tokens alone; and its features ``[K, len(capture)·H]``: the hidden states after
        each layer count of ``capture``, side by side, at every new position (empty ``[K, 0]`` without capture).
        """
        keys, values, row_slot, row_position, token_ids = [], [], [], [], []
        for slot, (cache, new_ids, _) in enumerate(requests):
            if cache.keys.shape[1] != 1:
                raise ValueError("forward_rows takes caches of one row each")
            if not new_ids:
                raise ValueError("every request of a batched forward brings at least one token")
            slot_keys, slot_values = cache.slots()
            keys += slot_keys
            values += slot_values
            start = int(cache.lengths[0])
            row_slot += [slot] * len(new_ids)
            row_position += range(start, start + len(new_ids))
            token_ids += new_ids
        *captured, x = self._decode_rows(torch.tensor(token_ids), keys, values, row_slot, row_position, None, capture)
        features = torch.cat(captured, dim=-1) if captured else x.new_empty(x.shape[0], 0)  # [R, C·H]
        pieces, wanted, offset = [], [], 0
        for cache, new_ids, last_only in requests:
            cache.lengths += len(new_ids)
            offset += len(new_ids)
            wanted.append(1 if last_only else len(new_ids))
            pieces.append(x[offset - wanted[-1] : offset])
        logits, hidden = self._head(torch.cat(pieces))  # [R', V], [R', H]
        sizes = [len(new_ids) for _, new_ids, _ in requests]
        return list(logits.split(wanted)), list(hidden.split(wanted)), list(features.split(sizes))

"""The native decoder (the families ``architecture.py`` describes) written for bit-exactness.

Every operation gives a token's row the same bits whatever else is in the call:
- linear layers are :class:`QuantizedLinear` (exact integer GEMMs, per-row activation scales, in one 8-bit pass
  or two: ``DecoderConfig.activation_passes`` for the decoder layers, one for the LM head);
- RMSNorm (of rows, and of q and k heads), RoPE, the gate's activation and residual adds are row-wise or
  element-wise;
- attention runs query by query: the query at position p attends to exactly the cached keys 0..p (the last W
  of them in a sliding-window layer, W fixed per layer) with the same shapes and strides whether it comes alone
  (decode), inside a verify block at any offset, or again after a rollback. The cache keeps every position, so
  a sliding window rolls back like the rest: moving a length.
So a position's logits are bitwise identical in a 1-token step and in a k-token block, which
makes greedy speculative decoding equal to greedy decoding by construction. So a prompt's rows can go through the
layers in passes of ``DecoderConfig.rows_per_pass`` rows, one after another (a pass reads the earlier ones' keys).

The layers run as one call of the compiled kernels (``layers.h``: a layer's steps between its GEMMs
fused into 8 kernels) or, when they cannot be built, as PyTorch operations (:meth:`Decoder._layer`, the
readable reference the tests compare the kernels with). Both are row-wise; their bits differ only in
RMSNorm's sum, attention's dot products, sums and exp, and the activation's exp.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from quickdraft.runtime.names import KV_CACHE_DEFAULT
from quickdraft.runtime.native.architecture import ACTIVATIONS
from quickdraft.runtime.native.cache import KEY_BLOCK, KV_DTYPES, Slots, StaticKVCache, key_rows
from quickdraft.runtime.native.config import DecoderConfig, rope_tables
from quickdraft.runtime.native.embedding import TokenEmbedding
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.layer import ACTIVATION_FUNCTIONS, DecoderLayer
from quickdraft.runtime.native.linear import QuantizedLinear


class Decoder:
    """Weights plus ``forward(token_ids, cache)``; see the module docstring for why it is bit-exact."""

    def __init__(
        self,
        config: DecoderConfig,
        embedding: TokenEmbedding,
        layers: list[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: QuantizedLinear,
        capacity: int,
    ) -> None:
        self.config = config
        self.embedding = embedding  # token ids [R] -> [R, H] float32
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.capacity = capacity
        tables = {rope: rope_tables(rope, config.head_dim, capacity) for rope in set(config.layer_ropes)}
        self.layer_rope = [tables[rope] for rope in config.layer_ropes]  # per layer: cos, sin [C, D] (shared)
        self.attention_scale = config.attention_scale
        self.use_kernel = True  # the compiled kernels when they build (False: the PyTorch reference path)
        self.kv_dtype = KV_DTYPES[KV_CACHE_DEFAULT]  # what new caches hold keys and values as (KV_DTYPES)
        self.vocabulary: torch.Tensor | None = None  # the token ids the LM head computes (None: all)
        self.all_rows_head = lm_head  # the LM head over every token (a restricted one selects from it)
        self.focus: torch.Tensor = torch.empty(0, dtype=torch.long)  # tokens computed beside the vocabulary
        self.focus_head: Any = None  # the LM head over them (None: no focus)
        self._layers_spec: Any = None  # the compiled layer loop, built on first use

    @classmethod
    def from_native_state(cls, config: DecoderConfig, state: dict[str, torch.Tensor], capacity: int) -> Decoder:
        """Build from :func:`quantize_state_dict`'s layout (packed weight parts, float norms and biases)."""
        layers = [DecoderLayer.from_state(config, state, i) for i in range(config.num_layers)]
        # The LM head reads its input in one pass: it is a large share of a small model's step, and its rows are the
        # last error a logit takes (docs/families.md has what a second pass costs and gains)
        lm_head = QuantizedLinear.from_state("lm_head", state)
        embedding = TokenEmbedding.from_state("embedding", state)
        return cls(config, embedding, layers, state["final_norm"], lm_head, capacity)

    def new_cache(self, batch_size: int) -> StaticKVCache:
        return StaticKVCache(self.config, batch_size, self.capacity, self.kv_dtype)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm over the last dimension; an empty weight means no norm (x as it is)."""
        if weight.numel() == 0:
            return x
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return weight * (x * torch.rsqrt(variance + self.config.rms_norm_eps))

    def _norm_heads(self, x: torch.Tensor, weight: torch.Tensor, heads: int) -> torch.Tensor:
        """``x [R, heads·D]`` RMSNorm'd in spans of the weight's width (a head, or all heads) -> ``[R, heads, D]``."""
        span = weight.numel() or x.shape[-1]
        return self._rms_norm(x.reshape(x.shape[0], -1, span), weight).reshape(x.shape[0], heads, -1)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE on the first R = cos.shape[-1] dimensions of ``x [..., D]``; the others pass unchanged."""
        dims = cos.shape[-1]
        turning, passing = x[..., :dims], x[..., dims:]
        half = dims // 2
        rotated = torch.cat([-turning[..., half:], turning[..., :half]], dim=-1)
        return torch.cat([turning * cos + rotated * sin, passing], dim=-1)

    def _attend(
        self, index: int, q: torch.Tensor, keys: Slots, values: Slots, row_slot: list[int], row_position: list[int],
        row_index: list[int],
    ) -> torch.Tensor:  # fmt: skip
        """Causal attention of ``q [R, heads, D]`` over layer ``index`` of the rows' cache slots -> ``[R, heads·D]``;
        row r is position ``row_position[r]`` of slot ``row_slot[r]`` and sees that slot's positions 0 ..
        row_position[r] (the last W of them in a layer with a sliding window W), its own key and value, kept at
        ``row_index[r]``, in the place of its position (a tree's leaf: :meth:`forward_tree`)."""
        window = self.config.layer_windows[index]
        if self.use_kernel and (kernel := native_kernels()) is not None:
            cap, scale = self.config.attention_softcap or 0.0, self.attention_scale
            return kernel.attend(q, keys, values, index, row_slot, row_position, row_index, scale, window, cap)
        rows, heads, head_dim = q.shape
        attended = torch.empty(rows, heads * head_dim)
        for r, (slot, position, own) in enumerate(zip(row_slot, row_position, row_index, strict=True)):
            first = max(0, position + 1 - window) if window else 0
            all_keys = key_rows(keys[slot][index], own + 1).float()  # [kv, own + 1, D] (a half widens exactly)
            all_values = values[slot][index, :, : own + 1].float()  # [kv, own + 1, D]
            slot_keys, slot_values = all_keys[:, first : position + 1], all_values[:, first : position + 1]
            if own != position:  # a tree's leaf: its own key and value in the place of its position
                slot_keys = torch.cat([slot_keys[:, :-1], all_keys[:, own : own + 1]], dim=1)
                slot_values = torch.cat([slot_values[:, :-1], all_values[:, own : own + 1]], dim=1)
            kv_heads = slot_keys.shape[0]
            query = q[r].reshape(kv_heads, heads // kv_heads, head_dim) * self.attention_scale
            scores = torch.matmul(query, slot_keys.transpose(-1, -2))  # [kv, G, position + 1]
            if self.config.attention_softcap is not None:
                scores = torch.tanh(scores / self.config.attention_softcap) * self.config.attention_softcap
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
        row_index: list[int],
    ) -> torch.Tensor:
        """Decoder layer ``index`` in PyTorch operations: ``x [R, H]`` -> ``[R, H]``; rows' keys and values cached at
        their ``row_index``."""
        rows = x.shape[0]
        heads, kv_heads, head_dim = self.config.num_heads, self.config.num_kv_heads, self.config.head_dim
        positions = torch.tensor(row_position)
        rope_cos, rope_sin = self.layer_rope[index]
        cos, sin = rope_cos[positions][:, None], rope_sin[positions][:, None]  # [R, 1, D]
        qkv = layer.qkv(self._rms_norm(x, layer.input_norm))  # [R, (heads + 2·kv_heads)·D]
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = self._rotate(self._norm_heads(q, layer.q_norm, heads), cos, sin)  # [R, heads, D]
        k = self._rotate(self._norm_heads(k, layer.k_norm, kv_heads), cos, sin)
        v = v.reshape(rows, kv_heads, head_dim)
        for r, (slot, own) in enumerate(zip(row_slot, row_index, strict=True)):
            keys[slot][index, :, own // KEY_BLOCK, :, own % KEY_BLOCK] = k[r]
            values[slot][index, :, own] = v[r]
        attended = layer.out(self._attend(index, q, keys, values, row_slot, row_position, row_index))  # [R, H]
        x = x + self.config.residual_scale * self._rms_norm(attended, layer.attention_out_norm)
        normed = self._rms_norm(x, layer.post_norm)
        activation = ACTIVATION_FUNCTIONS[ACTIVATIONS[self.config.activation]]
        if layer.experts is not None:
            mlp = layer.experts(normed, activation)  # [R, H]
        else:
            gate, up = layer.gate_up(normed).chunk(2, dim=-1)  # [R, I] each
            mlp = layer.down(activation(gate) * up)
        return x + self.config.residual_scale * self._rms_norm(mlp, layer.mlp_out_norm)

    def _decode_rows(
        self,
        token_ids: torch.Tensor,
        keys: Slots,
        values: Slots,
        row_slot: list[int],
        row_position: list[int],
        exit_layer: int | None = None,
        capture: Sequence[int] = (),
        row_index: list[int] | None = None,
    ) -> list[torch.Tensor]:
        """The decoder layers (the first ``exit_layer`` of them) over rows of new tokens ``token_ids [R]``; row r is
        position ``row_position[r]`` of cache slot ``row_slot[r]`` (``keys[s]``, ``values[s]``: that slot's, from
        :meth:`StaticKVCache.slots`), its key and value kept at ``row_index[r]`` (default: its position). Writes the
        rows' keys and values; returns the hidden states ``[R, H]`` after each layer count in ``capture``
        (ascending), then after the last layer, all before the final norm."""
        row_index = row_position if row_index is None else row_index
        if max(row_index) >= self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {max(row_index) + 1} needed")
        layers = self.layers[:exit_layer]
        if list(capture) != sorted(set(capture)) or not all(1 <= count <= len(layers) for count in capture):
            raise ValueError(f"capture names ascending layer counts in 1..{len(layers)}, got {list(capture)}")
        if len(token_ids) > (step := self.config.rows_per_pass):  # in passes, in order: see the module docstring
            run, cuts = self._decode_rows, [slice(i, i + step) for i in range(0, len(token_ids), step)]
            passes = [
                run(token_ids[s], keys, values, row_slot[s], row_position[s], exit_layer, capture, row_index[s])
                for s in cuts
            ]
            return [torch.cat(outputs) for outputs in zip(*passes, strict=True)]
        x = self.embedding(token_ids)  # [R, H]
        if self.config.embedding_scale != 1.0:
            x = x * self.config.embedding_scale
        if self.use_kernel and (kernels := native_kernels()) is not None:  # the same operations, in one call
            compiled = self._compiled_layers(kernels)
            return compiled.forward(x, keys, values, row_slot, row_position, row_index, len(layers), list(capture))
        captured = []
        for index, layer in enumerate(layers):
            x = self._layer(index, layer, x, keys, values, row_slot, row_position, row_index)
            if index + 1 in capture:
                captured.append(x)
        return [*captured, x]

    def _compiled_layers(self, kernels: Any) -> Any:
        """The layers as ``layers.h`` runs them: :meth:`_layer`'s steps as fused kernels, in one call."""
        if self._layers_spec is None:
            specs = [layer.kernel_spec(kernels, *self.layer_rope[index]) for index, layer in enumerate(self.layers)]
            config = self.config
            scalars = (config.rms_norm_eps, self.attention_scale, config.attention_softcap or 0, config.residual_scale)
            self._layers_spec = kernels.Layers(
                specs, config.num_heads, *scalars, ACTIVATIONS[config.activation], config.activation_passes
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

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over Granite's divisor, then cap · tanh(logits / cap) where capped (element-wise, as every row)."""
        divisor, cap = self.config.logits_divisor, self.config.final_logit_softcap
        logits = logits / divisor if divisor != 1.0 else logits
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final norm and LM head: hidden ``x [R, H]`` -> (logits ``[R, V]``, normed hidden ``[R, H]``)."""
        if self.use_kernel and (kernels := native_kernels()) is not None:
            hidden = kernels.rms_norm(x, self.final_norm, self.config.rms_norm_eps)
        else:
            hidden = self._rms_norm(x, self.final_norm)
        logits = self._softcap(self.lm_head(hidden))  # [R, V] or [R, |vocabulary|]
        if self.vocabulary is None:
            return logits, hidden
        full = torch.full((x.shape[0], self.config.vocab_size), -torch.inf)
        full[:, self.vocabulary] = logits
        if self.focus_head is not None:
            full[:, self.focus] = self._softcap(self.focus_head(hidden))  # [R, |focus|]
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
    def forward_tree(self, cache: StaticKVCache, token_ids: list[int], depths: list[int]) -> torch.Tensor:
        """Append a token tree to a one-row ``cache``: its chain first (row j at depth j), then leaves (row j at depth
        ``depths[j]`` in 1..chain size, a sibling of the chain's token at that depth, or a child of its last).

        Row j is position length + depths[j] and keeps its key and value at index length + j, so a leaf attends to
        the chain before its depth and then to itself: its logits have the bits of a chain holding its token at that
        depth. Returns logits ``[K, V]``; the length grows by the chain's size. An accepted leaf's key and value go
        to their position with :meth:`StaticKVCache.move`."""
        chain = next((j for j, depth in enumerate(depths) if depth != j), len(depths))
        if cache.keys.shape[1] != 1 or len(token_ids) != len(depths) or chain == 0:
            raise ValueError("a tree is one row's tokens with a depth each, its chain (depths 0, 1, ...) first")
        if not all(1 <= depth <= chain for depth in depths[chain:]):
            raise ValueError(f"a leaf's depth is 1..{chain}, the chain's size: its parent is a chain token")
        start = int(cache.lengths[0])
        keys, values = cache.slots()
        rows = range(len(token_ids))
        position, index = [start + depths[j] for j in rows], [start + j for j in rows]
        x = self._decode_rows(torch.tensor(token_ids), keys, values, [0] * len(rows), position, None, (), index)[-1]
        cache.lengths += chain
        return self._head(x)[0]  # [K, V]

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

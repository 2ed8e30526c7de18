"""The draft head (EAGLE-3 style): one decoder layer over the target's features and its own previous output.

At sequence position p the head reads the target's hidden states after its feature layers ``f_p [C·H]`` (fused
to ``H`` by ``fc``) and the embedding of the token at p + 1, and predicts the token at p + 2 over its vocabulary
(a frequency-ranked subset of the target's; its LM head is the target's rows for those tokens, frozen). Drafting
further, the head reads its own output at the previous position in place of the target's features.

The layer: ``x = cat(embed_norm(e), feature_norm(h)) [2H]`` -> attention (RoPE at the sequence position) plus
the residual ``h`` -> RMSNorm, SwiGLU MLP plus the residual -> the output ``o [H]``; ``logits = lm_head(norm(o))``.

Training unrolls drafting (EAGLE-3's training-time test): step j > 0 reads step j - 1's output one position back
and attends to the target-feature (step 0) keys at positions <= p - j and to its own earlier steps' keys on its
diagonal, exactly what a query j tokens into a draft sees at inference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from quickdraft.errors import ConfigError


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_features: int  # C: target layers whose hidden states are read
    vocabulary_size: int  # the head's vocabulary (a subset of the target's)
    target_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("the head's attention heads must be a multiple of its key/value heads")
        if not 1 <= self.vocabulary_size <= self.target_vocab_size:
            raise ConfigError(f"the head's vocabulary must hold 1..{self.target_vocab_size} tokens")

    @classmethod
    def for_target(cls, target: Any, intermediate_size: int, num_features: int, vocabulary_size: int) -> HeadConfig:
        """A head shaped like ``target``'s layers (its DecoderConfig: width, attention heads, RoPE, norm epsilon)."""
        shared = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "rms_norm_eps", "rope_theta")
        return cls(
            **{name: getattr(target, name) for name in shared},
            intermediate_size=intermediate_size,
            num_features=num_features,
            vocabulary_size=vocabulary_size,
            target_vocab_size=target.vocab_size,
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return (self.weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: ``x [..., T, D]`` with ``cos``, ``sin`` ``[T, D]`` of its positions."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DraftHead(nn.Module):
    """The trainable layer plus the frozen LM head rows; the target's embedding is passed in, never stored."""

    def __init__(self, config: HeadConfig, vocabulary: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.config = config
        self.fc = nn.Linear(config.num_features * h, h, bias=False)
        self.embed_norm = RMSNorm(h, config.rms_norm_eps)
        self.feature_norm = RMSNorm(h, config.rms_norm_eps)
        self.q = nn.Linear(2 * h, config.num_heads * d, bias=False)
        self.k = nn.Linear(2 * h, config.num_kv_heads * d, bias=False)
        self.v = nn.Linear(2 * h, config.num_kv_heads * d, bias=False)
        self.o = nn.Linear(config.num_heads * d, h, bias=False)
        self.post_norm = RMSNorm(h, config.rms_norm_eps)
        self.gate = nn.Linear(h, config.intermediate_size, bias=False)
        self.up = nn.Linear(h, config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, h, bias=False)
        self.final_norm = RMSNorm(h, config.rms_norm_eps)
        self.register_buffer("vocabulary", vocabulary.long(), persistent=True)  # [Vd] target token ids
        self.register_buffer("lm_head", lm_head.float(), persistent=True)  # [Vd, H], frozen
        index = torch.full((config.target_vocab_size,), -1, dtype=torch.long)
        index[vocabulary.long()] = torch.arange(len(vocabulary))
        self.register_buffer("draft_index", index, persistent=False)  # [V] target id -> head index or -1
        self.native_lm_head: nn.Module | None = None  # the LM head on integer kernels (draft_head.native)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, D]`` at ``positions [T]``."""
        d = self.config.head_dim
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = positions.double()[:, None] * inv_freq[None]  # [T, D/2]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().float(), angles.sin().float()

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[..., C·H]`` -> the head's hidden input ``[..., H]``."""
        return self.fc(features)

    def qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``embeds``, ``hidden [B, T, H]`` -> q ``[B, heads, T, D]``, k and v ``[B, kv_heads, T, D]`` (rotated)."""
        c = self.config
        x = torch.cat([self.embed_norm(embeds), self.feature_norm(hidden)], dim=-1)  # [B, T, 2H]
        batch, length = x.shape[:2]
        q = self.q(x).view(batch, length, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k(x).view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(x).view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(self, attended: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Attention output ``[B, heads, T, D]`` and the residual ``hidden [B, T, H]`` -> the output ``o [B, T, H]``."""
        batch, _, length, _ = attended.shape
        x = hidden + self.o(attended.transpose(1, 2).reshape(batch, length, -1))
        normed = self.post_norm(x)
        return x + self.down(nn.functional.silu(self.gate(normed)) * self.up(normed))

    def logits(self, output: torch.Tensor) -> torch.Tensor:
        """The output ``[..., H]`` -> logits over the head's vocabulary ``[..., Vd]``."""
        if self.native_lm_head is not None:
            return self.native_lm_head(self.final_norm(output))
        return self.final_norm(output) @ self.lm_head.to(output.dtype).T

    def train_forward(
        self, features: torch.Tensor, next_embeds: torch.Tensor, valid: torch.Tensor, steps: int
    ) -> list[torch.Tensor]:
        """:meth:`unroll`'s outputs as logits ``[B, T, Vd]`` per step."""
        return [self.logits(output) for output in self.unroll(features, next_embeds, valid, steps)]

    def unroll(
        self, features: torch.Tensor, next_embeds: torch.Tensor, valid: torch.Tensor, steps: int
    ) -> list[torch.Tensor]:
        """Unrolled drafting over whole sequences: per step j, the outputs ``[B, T, H]`` at each position p, whose
        logits predict the token at p + 2 after j drafting steps (valid where p >= j).

        features: [B, T, C·H] the target's, per position; next_embeds: [B, T, H] the embedding of the token at
        p + 1 (the true tokens: teacher forcing); valid: [B, T] bool, real positions.
        """
        _batch, length = features.shape[:2]
        c = self.config
        group = c.num_heads // c.num_kv_heads
        cos, sin = self.rope(torch.arange(length))
        scale = 1.0 / math.sqrt(c.head_dim)
        positions = torch.arange(length)
        hidden = self.fuse(features)  # [B, T, H]
        keys, values, outputs = [], [], []
        for step in range(steps):
            if step > 0:  # the previous step's output one position back
                hidden = torch.cat([torch.zeros_like(outputs[-1][:, :1]), outputs[-1][:, :-1]], dim=1)
            q, k, v = self.qkv(next_embeds, hidden, cos, sin)  # a query at p reads the token at p + 1 at any step
            keys.append(k.repeat_interleave(group, dim=1))
            values.append(v.repeat_interleave(group, dim=1))  # [B, heads, T, D]
            scores = torch.matmul(q, keys[0].transpose(-1, -2)) * scale  # [B, heads, T, T]
            allowed = positions[None, :] <= positions[:, None] - step  # key <= query - step
            # A query before `step` has no draft start; it sees position 0 (it is never trained on) so that no
            # row of the softmax is empty: a NaN there would reach the gradients through 0 · NaN.
            allowed = (allowed | (positions[None, :] == 0)) & valid[:, None, None, :]
            scores = scores.masked_fill(~allowed, float("-inf"))
            # step i's key and value at position p - (step - i), i = 1 .. step
            shifted = [
                [nn.functional.pad(t[i], (0, 0, step - i, 0))[:, :, :length] for t in (keys, values)]
                for i in range(1, step + 1)
            ]
            diagonal = [(q * shifted_k).sum(-1, keepdim=True) * scale for shifted_k, _ in shifted]  # [B, heads, T, 1]
            weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
            attended = torch.matmul(weights[..., :length], values[0])
            for i, (_, shifted_v) in enumerate(shifted, start=1):
                attended = attended + weights[..., length + i - 1 : length + i] * shifted_v
            outputs.append(self.finish(attended, hidden))
        return outputs

    @torch.inference_mode()
    def decode(self, embeds: torch.Tensor, hidden: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """New rows at positions ``cache.length ..``: ``embeds``, ``hidden [1, K, H]`` -> outputs ``[1, K, H]``;
        their keys and values are appended (each row attends to the cache and to the rows before it)."""
        length = embeds.shape[1]
        start = cache.length
        cos, sin = self.rope(torch.arange(start, start + length))
        q, k, v = self.qkv(embeds, hidden, cos, sin)  # [1, heads, K, D], [1, kv, K, D] x2
        cache.append(k, v)
        c = self.config
        # The G query heads of a key/value head share its keys: stacked as G·K query rows, they read the cache where
        # it lies (a copy per query head would copy the whole cache at every drafted token).
        group = c.num_heads // c.num_kv_heads
        q = q.reshape(1, c.num_kv_heads, group * length, c.head_dim)  # [1, kv, G·K, D]
        keys, values = cache.keys[:, :, : cache.length], cache.values[:, :, : cache.length]  # [1, kv, S, D]
        scores = torch.matmul(q, keys.transpose(-1, -2)) / math.sqrt(c.head_dim)  # [1, kv, G·K, S]
        allowed = torch.arange(cache.length)[None, :] <= torch.arange(start, start + length)[:, None]  # [K, S]
        weights = torch.softmax(scores.masked_fill(~allowed.repeat(group, 1), float("-inf")), dim=-1)
        attended = torch.matmul(weights, values).view(1, c.num_heads, length, c.head_dim)  # [1, heads, K, D]
        return self.finish(attended, hidden)


class HeadCache:
    """The head's keys and values of one request ``[1, kv_heads, capacity, D]``, grown as needed; rollback
    moves ``length``."""

    def __init__(self, config: HeadConfig, dtype: torch.dtype = torch.float32) -> None:
        self.keys = torch.empty(1, config.num_kv_heads, 256, config.head_dim, dtype=dtype)
        self.values = torch.empty_like(self.keys)
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = self.length + keys.shape[2]
        if end > self.keys.shape[2]:
            padding = (0, 0, 0, max(end, 2 * self.keys.shape[2]) - self.keys.shape[2])  # more positions
            self.keys, self.values = (nn.functional.pad(cached, padding) for cached in (self.keys, self.values))
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.length = end

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a head cache of {self.length} positions to {length}")
        self.length = length

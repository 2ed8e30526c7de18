"""The runtime interface: a model's forward pass over a KV cache that can be rolled back.

A runtime turns new token ids into logits for every new position, appending their keys
and values to a cache; rolling back is truncating the cache to a length. Everything the
engine and drafters need from a model goes through this interface, so a faster runtime
(static cache, quantized kernels, a GPU) slots in without touching the engine.

Shapes keep a batch dimension: B rows, each with its own cache length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch


class KVCache(ABC):
    """Keys and values of the tokens a runtime has seen, per row."""

    @property
    @abstractmethod
    def lengths(self) -> torch.Tensor:
        """[B] int64: how many tokens each row holds."""

    @abstractmethod
    def truncate(self, lengths: torch.Tensor | int) -> None:
        """Roll back: keep the first ``lengths`` tokens of each row (an int applies to all rows)."""


class Runtime(ABC):
    """A causal LM: forward(new token ids, cache) -> logits of every new position."""

    vocab_size: int  # width of the logits
    max_context: int  # positions the model supports
    device: torch.device

    @classmethod
    @abstractmethod
    def load(cls, path: Path) -> Runtime:
        """Load the model in the transformers directory ``path``."""

    @abstractmethod
    def new_cache(self, batch_size: int = 1) -> KVCache:
        """An empty cache for ``batch_size`` rows."""

    @abstractmethod
    def forward(self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        """Append ``token_ids [B, K]`` to ``cache``; return float32 logits ``[B, K, V]``.

        ``last_only`` returns ``[B, 1, V]`` for the last position only (prefill).
        """

"""The runtime interface: a model's forward pass over a KV cache that can be rolled back.

A runtime turns new token ids into logits for every new position, appending their keys
and values to a cache; rolling back is truncating the cache to a length. Everything the
engine and drafters need from a model goes through this interface, so a faster runtime
(static cache, quantized kernels, a GPU) slots in without touching the engine.

Shapes keep a batch dimension: B rows, each with its own cache length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any, ClassVar

import torch

from quickdraft.errors import ConfigError
from quickdraft.runtime.device import CPU, synchronize

PLACEHOLDER_CHUNK = 512  # tokens per forward when a runtime fills a cache by reading (Runtime.fill_placeholder)


class KVCache(ABC):
    """Keys and values of the tokens a runtime has seen, per row."""

    @property
    @abstractmethod
    def lengths(self) -> torch.Tensor:
        """[B] int64: how many tokens each row holds."""

    @abstractmethod
    def truncate(self, lengths: torch.Tensor | int) -> None:
        """Roll back: keep the first ``lengths`` tokens of each row (an int applies to all rows)."""


@dataclass(frozen=True)
class BatchRow:
    """One request's part of a batched forward (:meth:`Runtime.forward_batch`)."""

    cache: KVCache  # the request's own cache, of one row
    token_ids: Sequence[int]  # [K] its new tokens, K >= 1
    last_only: bool = False  # logits of the last new position only (a prompt or a chunk of one)


@dataclass(frozen=True)
class LoadOptions:
    """What a runtime may trade when it loads a model. Worth it for a draft model, whose weights change only how
    often its drafts are accepted, never the output; the transformers runtime takes only the defaults."""

    weights: str = "auto"  # the native runtime's weight format: auto, q4 or int8 (native/weights.py)
    vocabulary: tuple[int, ...] | None = None  # the token ids the LM head computes, the rest get logit −inf (None: all)
    device: torch.device = CPU  # where the model runs (runtime/device.py); the native runtime: CPU
    progress: bool = False  # bars on stderr for a first load's long work (packing the weights, building kernels)
    kv_cache_dtype: str | None = None  # the native runtime's KV cache: float16 or float32 (None: KV_CACHE_DEFAULT)
    max_context: int | None = None  # positions a request may hold at most, a cap on the model's own (None: no cap)

    def __post_init__(self) -> None:
        given = self.max_context
        if given is not None and (not isinstance(given, Integral) or isinstance(given, bool) or given < 1):
            message = f"max_context is a number of positions >= 1 (None: the model's whole context), got {given!r}"
            raise ConfigError(message, "max_context")

    def context(self, declared: int) -> int:
        """The positions a model whose config declares ``declared`` holds when loaded with these options."""
        return declared if self.max_context is None else min(declared, int(self.max_context))

    def check_capped(self, runtime: Runtime, model: str) -> None:
        """A cap is a cap: more positions than the loaded ``model`` declares is an error, not a context it holds."""
        if self.max_context is not None and self.max_context > runtime.max_context:
            message = f"max_context {self.max_context} is more than {model}'s context of {runtime.max_context}"
            raise ConfigError(f"{message} positions: give at most that", "max_context")


class Runtime(ABC):
    """A causal LM: forward(new token ids, cache) -> logits of every new position."""

    name: ClassVar[str]  # its registry name
    vocab_size: int  # width of the logits
    hidden_size: int  # width of the last hidden state (``forward_with_hidden``), what the LM head reads
    max_context: int  # positions the model supports
    device: torch.device
    build: str = ""  # what the speed and logits depend on besides the model files (weight format, kernels, versions)
    kv_cache_dtype: str = "float32"  # what its KV caches hold keys and values as

    @classmethod
    @abstractmethod
    def load(cls, path: Path, options: LoadOptions = LoadOptions()) -> Runtime:
        """Load the model in the transformers directory ``path``."""

    @classmethod
    def load_sharing(
        cls,
        path: Path,
        transformers_model: Callable[[], Any],
        options: LoadOptions = LoadOptions(),
    ) -> Runtime:
        """Load ``path`` where an fp32 transformers copy of it is at hand (``transformers_model()``
        returns it, loading it once); runtimes that can run that copy use it instead of loading again."""
        return cls.load(path, options)

    @abstractmethod
    def new_cache(self, batch_size: int = 1) -> KVCache:
        """An empty cache for ``batch_size`` rows."""

    takes_load_options: ClassVar[bool] = False  # ``load`` honours non-default LoadOptions
    num_layers: int = 0  # decoder layers; > 0 when ``forward_early_exit`` is supported
    supports_early_exit: ClassVar[bool] = False
    provides_hidden: ClassVar[bool] = False  # ``forward_with_hidden`` is available
    provides_features: ClassVar[bool] = False  # ``forward_batch_with_features`` is available
    # A position's keys and values do not depend on how the tokens before it were read (in one forward, in
    # chunks, beside other rows), so a cache's prefix can serve another request bit for bit (prefix caching).
    reusable_prefixes: ClassVar[bool] = False
    kv_bytes_per_token: int = 0  # memory of one position's keys and values in a cache, all layers

    def synchronize(self) -> None:
        """Wait for the forwards queued on the model's device (a GPU runs them asynchronously): a timer read after
        this sees them done."""
        synchronize(self.device)

    def cache_bytes(self, positions: int) -> int:
        """The memory a one-row cache holding ``positions`` takes: what a prefix cache counts its entries by."""
        return positions * self.kv_bytes_per_token

    def copy_prefix(self, cache: KVCache, length: int) -> KVCache:
        """A new one-row cache holding the first ``length`` positions of ``cache``'s (runtimes with
        ``reusable_prefixes``)."""
        raise NotImplementedError(f"the {self.name} runtime cannot copy a cache's prefix")

    def fill_placeholder(self, cache: KVCache, num_tokens: int) -> None:
        """Append ``num_tokens`` positions to every row of ``cache`` with keys and values that stand in for a
        text's: a cache as long as a real one, to time a forward at that context without reading a prompt first
        (calibration; what attends to them means nothing). This default reads random tokens, a chunk at a time;
        runtimes that can write the positions directly do."""
        generator = torch.Generator().manual_seed(0)
        rows = int(cache.lengths.shape[0])
        for start in range(0, num_tokens, PLACEHOLDER_CHUNK):
            chunk = min(PLACEHOLDER_CHUNK, num_tokens - start)
            self.forward(torch.randint(0, self.vocab_size, (rows, chunk), generator=generator), cache, last_only=True)

    def forward_with_hidden(
        self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` plus the last hidden state (after the final norm) ``[B, K or 1, H]``."""
        raise NotImplementedError(f"the {self.name} runtime does not expose hidden states")

    def forward_early_exit(self, token_ids: torch.Tensor, cache: KVCache, start: int, exit_layer: int) -> torch.Tensor:
        """Logits ``[1, K, V]`` of the first ``exit_layer`` layers plus the final norm and LM head.

        Writes those layers' keys and values at positions ``start``.. of ``cache`` without changing
        its length (a later full forward over the same positions overwrites them).
        """
        raise NotImplementedError(f"the {self.name} runtime cannot exit early")

    def focus_vocabulary(self, token_ids: Sequence[int]) -> None:
        """A runtime whose LM head computes part of the vocabulary (``LoadOptions.vocabulary``) computes these
        tokens too from now on (replacing the previous focus): a draft model focused on a request's prompt can
        draft the prompt's rare tokens. A runtime that computes every token ignores it."""
        return None

    @abstractmethod
    def forward(self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        """Append ``token_ids [B, K]`` to ``cache``; return float32 logits ``[B, K, V]``.

        Row b's logits depend on row b's tokens and cache alone (the native runtime keeps them
        bit-identical whatever B).

        ``last_only`` returns ``[B, 1, V]`` for the last position only (prefill).
        """

    def forward_batch(self, rows: Sequence[BatchRow]) -> list[torch.Tensor]:
        """One forward over several requests' new tokens (continuous batching); per row its float32 logits
        ``[K, V]`` (``[1, V]`` if last_only), and each cache advanced by its K tokens.

        A row's logits are what :meth:`forward` gives its cache and tokens alone. This default runs the rows
        one after another; the native runtime puts them side by side in one pass, bit-identically.
        """
        return [self.forward(torch.tensor([list(row.token_ids)]), row.cache, row.last_only)[0] for row in rows]

    def forward_batch_with_hidden(self, rows: Sequence[BatchRow]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """:meth:`forward_batch` plus each row's last hidden states (after the final norm) ``[K or 1, H]``, for
        runtimes that :attr:`provides_hidden`. This default runs the rows one after another."""
        logits, hidden = [], []
        for row in rows:
            row_logits, row_hidden = self.forward_with_hidden(
                torch.tensor([list(row.token_ids)]), row.cache, row.last_only
            )
            logits.append(row_logits[0])
            hidden.append(row_hidden[0])
        return logits, hidden

    def forward_batch_with_features(
        self, rows: Sequence[BatchRow], layers: Sequence[int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """:meth:`forward_batch` plus each row's features ``[K, len(layers)·H]`` at every new position (also for a
        last_only row): the hidden states after each layer count in ``layers`` (ascending, before any norm), side
        by side, what a draft head trained on the target's features reads. For runtimes that
        :attr:`provides_features`."""
        raise NotImplementedError(f"the {self.name} runtime does not expose its layers' hidden states")

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The input embedding's rows of ``token_ids [n]``, ``[n, H]`` float32 (a new tensor), for a draft head that
        embeds tokens as the target does. For runtimes that :attr:`provides_features`."""
        raise NotImplementedError(f"the {self.name} runtime does not expose its embedding")

    def lm_head_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The LM head's weight rows ``[n, H]`` (float32) of ``token_ids [n]`` (sorted, distinct): what a draft head
        over those tokens starts from. For runtimes that :attr:`provides_features`."""
        raise NotImplementedError(f"the {self.name} runtime does not expose its LM head")

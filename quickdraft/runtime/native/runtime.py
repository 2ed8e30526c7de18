"""``native``: the runtime interface over :class:`Decoder` (Llama-family models: transformers directories, and
directories quickdraft made from GGUF files, whose weights it reads from the file)."""

from __future__ import annotations

import json
import mmap
from collections.abc import Sequence
from pathlib import Path

import torch

from quickdraft.errors import ConfigError, ModelFilesError
from quickdraft.machine import memory_bytes
from quickdraft.models.convert import read_marker
from quickdraft.runtime.base import BatchRow, KVCache, LoadOptions, Runtime
from quickdraft.runtime.names import KV_CACHE_DEFAULT, WEIGHT_FORMATS
from quickdraft.runtime.native.cache import KEY_BLOCK, KV_DTYPES, StaticKVCache
from quickdraft.runtime.native.config import DecoderConfig, InvalidConfig
from quickdraft.runtime.native.entries import NATIVE_FORMAT
from quickdraft.runtime.native.gguf_weights import READ_TYPES
from quickdraft.runtime.native.kernels import load_kernels, sources_digest
from quickdraft.runtime.native.model import Decoder
from quickdraft.runtime.native.weights import has_native_weights, load_native_state

ROPE_TABLE_BYTES = 8  # cos and sin in float32: a RoPE table's bytes per position and head dimension


class NativeCache(KVCache):
    def __init__(self, cache: StaticKVCache) -> None:
        self.static = cache

    @property
    def lengths(self) -> torch.Tensor:
        return self.static.lengths.clone()

    def truncate(self, lengths: torch.Tensor | int) -> None:
        lengths = torch.as_tensor(lengths, dtype=torch.long).expand_as(self.static.lengths)
        if bool((lengths > self.static.lengths).any()) or bool((lengths < 0).any()):
            raise ValueError(f"cannot truncate a cache of lengths {self.static.lengths.tolist()} to {lengths.tolist()}")
        self.static.lengths.copy_(lengths)  # rollback is moving a length; stale entries are overwritten later


class NativeRuntime(Runtime):
    """Integer weights (int8, or Q4_K-structured 4-bit) and per-row 8-bit activations on exact integer GEMMs:
    bit-exact logits whatever the block size or the batch (CPU)."""

    name = "native"
    takes_load_options = True
    supports_early_exit = True
    provides_hidden = True
    provides_features = True
    reusable_prefixes = True

    def __init__(self, decoder: Decoder, weights: str = "auto") -> None:
        self.decoder = decoder
        config = decoder.config
        element = decoder.kv_dtype.itemsize  # of a key's or a value's element in the cache
        self.kv_bytes_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * element
        self.vocab_size = decoder.config.vocab_size
        self.hidden_size = decoder.config.hidden_size
        self.max_context = decoder.capacity
        self.num_layers = decoder.config.num_layers
        self.device = torch.device("cpu")
        vocabulary = "all" if decoder.vocabulary is None else len(decoder.vocabulary)
        self.kv_cache_dtype = str(decoder.kv_dtype).removeprefix("torch.")
        kv = self.kv_cache_dtype
        self.build = f"native {NATIVE_FORMAT} {weights} vocabulary {vocabulary} kv {kv} kernels {sources_digest()}"

    @staticmethod
    def supports(path: Path) -> bool:
        """Whether the model in ``path`` is a family this runtime implements, with weights it can read (a GGUF
        file's tensor types, as its directory's marker records them); ``ModelFilesError`` for a config no model can
        have, which no runtime should run."""
        try:
            read_config(path)
        except (ValueError, KeyError, OSError, json.JSONDecodeError):
            return False
        tensor_types = (read_marker(path) or {}).get("tensor_types") or []  # a GGUF file's; none for other models
        return set(tensor_types) <= set(READ_TYPES) and has_native_weights(path)

    @classmethod
    def load(
        cls,
        path: Path,
        options: LoadOptions = LoadOptions(),  # noqa: B008 - frozen, shared
    ) -> NativeRuntime:
        """Load a model directory; its quantized form (``options.weights``: one of WEIGHT_FORMATS) is
        cached so later loads skip quantization. ``options.vocabulary`` restricts the LM head to those tokens."""
        if options.device.type != "cpu":
            raise ConfigError(f"the native runtime runs on the CPU only, not on {options.device}")
        if options.weights not in WEIGHT_FORMATS:
            raise ConfigError(f"unknown weight format {options.weights!r}; choose one of: {', '.join(WEIGHT_FORMATS)}")
        kv_cache = options.kv_cache_dtype or KV_CACHE_DEFAULT
        if not isinstance(kv_cache, str) or kv_cache not in KV_DTYPES:
            message = f"unknown KV cache dtype {kv_cache!r}; choose one of: {', '.join(KV_DTYPES)}"
            raise ConfigError(message, "kv_cache_dtype")
        try:
            config = read_config(path)
        except (ValueError, KeyError) as error:
            raise ModelFilesError(
                f"the native runtime cannot run {path}: {error}; the transformers runtime may", "runtime"
            ) from None
        except (OSError, json.JSONDecodeError) as error:
            raise ModelFilesError(f"cannot read {path / 'config.json'}: {error}") from None
        # A cache holds the model's whole context (32,768 positions for the default pair) by default: its memory is
        # only touched where tokens are written, so it grows with what a request uses, not with the capacity.
        positions = options.context(config.max_position_embeddings)
        check_rope_tables(path, config, positions)
        state = load_native_state(path, config, options.weights, options.progress)
        if state["final_norm"].shape[0] != config.hidden_size:  # shapes come from the weights: the config would lie
            width = state["final_norm"].shape[0]
            raise ModelFilesError(f"{path}: config.json says hidden_size {config.hidden_size}, the weights are {width}")
        load_kernels(options.progress)  # a first build takes a minute: said here, not inside the first forward
        decoder = Decoder.from_native_state(config, state, positions)
        decoder.kv_dtype = KV_DTYPES[kv_cache]
        if options.vocabulary is not None:  # tokens past the model's rows (a tokenizer's added ones) cannot be drawn
            vocabulary = [token for token in options.vocabulary if token < config.vocab_size]
            if not vocabulary or min(vocabulary) < 0:
                raise ConfigError(f"a vocabulary subset must name token ids in 0..{config.vocab_size - 1}")
            decoder.restrict_vocabulary(torch.tensor(vocabulary))
        return cls(decoder, options.weights)

    def focus_vocabulary(self, token_ids: Sequence[int]) -> None:
        self.decoder.focus_vocabulary(torch.tensor(list(token_ids), dtype=torch.long))

    def new_cache(self, batch_size: int = 1) -> NativeCache:
        return NativeCache(self.decoder.new_cache(batch_size))

    def cache_bytes(self, positions: int) -> int:
        """Whole pages: each (layer, head)'s keys and values are a span of their own (:class:`StaticKVCache`), which
        a few positions reach into whole pages, one more where the span does not start on a page."""
        config, page = self.decoder.config, mmap.PAGESIZE
        if positions == 0:
            return 0
        element = self.decoder.kv_dtype.itemsize
        keys = -(-positions // KEY_BLOCK) * KEY_BLOCK * config.head_dim * element  # whole blocks: a position's lanes
        values = positions * config.head_dim * element
        pages = sum(-(-size // page) + 1 for size in (keys, values))
        return config.num_layers * config.num_kv_heads * pages * page

    def copy_prefix(self, cache: KVCache, length: int) -> NativeCache:
        assert isinstance(cache, NativeCache), "a cache belongs to the runtime that made it"
        if not 0 <= length <= int(cache.static.lengths[0]):
            raise ValueError(f"cannot copy {length} positions of a cache holding {int(cache.static.lengths[0])}")
        copy = self.new_cache(1)
        blocks = -(-length // KEY_BLOCK)  # whole blocks of keys: positions past the length are never read
        copy.static.keys[:, :, :, :blocks].copy_(cache.static.keys[:, :1, :, :blocks])
        copy.static.values[:, :, :, :length].copy_(cache.static.values[:, :1, :, :length])
        copy.static.lengths.fill_(length)
        return copy

    def fill_placeholder(self, cache: KVCache, num_tokens: int) -> None:
        """Zeros at the next ``num_tokens`` positions of every row: attention reads them as it would a text's."""
        assert isinstance(cache, NativeCache), "a cache belongs to the runtime that made it"
        static = cache.static
        if num_tokens < 0 or int(static.lengths.max()) + num_tokens > static.capacity:
            raise ValueError(f"the cache holds {static.capacity} positions; cannot add {num_tokens}")
        for row, length in enumerate(static.lengths.tolist()):
            static.values[:, row, :, length : length + num_tokens].zero_()
            position = length
            while position < length + num_tokens:  # keys: blocks of KEY_BLOCK positions, transposed
                block, offset = divmod(position, KEY_BLOCK)
                count = min(length + num_tokens - position, KEY_BLOCK - offset)
                static.keys[:, row, :, block, :, offset : offset + count].zero_()
                position += count
        static.lengths += num_tokens

    def forward(self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        assert isinstance(cache, NativeCache), "a cache belongs to the runtime that made it"
        return self.decoder.forward(token_ids.cpu(), cache.static, last_only)

    def forward_with_hidden(
        self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert isinstance(cache, NativeCache), "a cache belongs to the runtime that made it"
        return self.decoder.forward(token_ids.cpu(), cache.static, last_only, return_hidden=True)

    def forward_batch(self, rows: Sequence[BatchRow]) -> list[torch.Tensor]:
        return self.forward_batch_with_hidden(rows)[0]

    def forward_batch_with_hidden(self, rows: Sequence[BatchRow]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        logits, hidden, _ = self.decoder.forward_rows(self._requests(rows))
        return logits, hidden

    def forward_batch_with_features(
        self, rows: Sequence[BatchRow], layers: Sequence[int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        logits, _, features = self.decoder.forward_rows(self._requests(rows), layers)
        return logits, features

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embedding(token_ids)

    def lm_head_rows(self, token_ids: torch.Tensor) -> torch.Tensor:  # over Granite's divisor: its logits' scale
        return self.decoder.all_rows_head.select_rows(token_ids).dequantize() / self.decoder.config.logits_divisor

    @staticmethod
    def _requests(rows: Sequence[BatchRow]) -> list[tuple[StaticKVCache, list[int], bool]]:
        requests = []
        for row in rows:
            assert isinstance(row.cache, NativeCache), "a cache belongs to the runtime that made it"
            requests.append((row.cache.static, list(row.token_ids), row.last_only))
        return requests

    def forward_early_exit(self, token_ids: torch.Tensor, cache: KVCache, start: int, exit_layer: int) -> torch.Tensor:
        assert isinstance(cache, NativeCache), "a cache belongs to the runtime that made it"
        if not 1 <= exit_layer < self.num_layers:
            raise ValueError(f"the exit layer must be in 1..{self.num_layers - 1}, got {exit_layer}")
        return self.decoder.forward(token_ids.cpu(), cache.static, exit_layer=exit_layer, starts=[start])


def read_config(path: Path) -> DecoderConfig:
    """The model's config as this runtime reads it: ``ModelFilesError`` for one no model can have, which no runtime
    should run; a ValueError or KeyError for one this runtime does not implement (another runtime may)."""
    try:
        return DecoderConfig.from_dir(path)
    except InvalidConfig as error:
        raise ModelFilesError(f"{path / 'config.json'} is no model's config: {error}") from None


def check_rope_tables(path: Path, config: DecoderConfig, positions: int) -> None:
    """The RoPE tables (cos and sin, float32, of every position and head dimension, per distinct RoPE) fit in this
    machine's memory: a context of millions of positions is a clear error, not an allocator's traceback."""
    needed = positions * config.head_dim * ROPE_TABLE_BYTES * len(set(config.layer_ropes))
    memory = memory_bytes()
    if memory is not None and needed > memory:
        capped = positions < config.max_position_embeddings
        context = "a context capped at {:,} positions" if capped else "its context of {:,} (max_position_embeddings)"
        raise ModelFilesError(
            f"{path}: {context.format(positions)} needs {needed / 2**30:,.1f} GiB of RoPE tables, more than this "
            f"machine's {memory / 2**30:,.1f} GiB of memory: cap the context lower (--max-context, or Pipeline.load's "
            "max_context)"
        )

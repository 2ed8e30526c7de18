"""``native``: the runtime interface over :class:`Decoder` (Llama-family models in transformers format)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quickdraft.errors import ModelFilesError
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.runtime.native.model import Decoder, DecoderConfig, StaticKVCache

DEFAULT_CAPACITY = 8192  # positions per cache; memory is only touched where tokens are written


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
    """int8 weights on fbgemm, fp32 activations, bit-exact logits whatever the block size (CPU)."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.vocab_size = decoder.config.vocab_size
        self.max_context = decoder.capacity
        self.device = torch.device("cpu")

    @staticmethod
    def supports(path: Path) -> bool:
        """Whether the model in ``path`` is a family this runtime implements."""
        try:
            DecoderConfig.from_dir(path)
        except (ValueError, KeyError, OSError, json.JSONDecodeError):
            return False
        return any(path.glob("*.safetensors"))

    @classmethod
    def load(cls, path: Path, capacity: int = DEFAULT_CAPACITY, activation_bits: int = 14) -> NativeRuntime:
        from safetensors.torch import load_file

        try:
            config = DecoderConfig.from_dir(path)
        except (ValueError, KeyError) as error:
            raise ModelFilesError(
                f"the native runtime cannot run {path}: {error} (use --runtime transformers)"
            ) from None
        except (OSError, json.JSONDecodeError) as error:
            raise ModelFilesError(f"cannot read {path / 'config.json'}: {error}") from None
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelFilesError(f"{path} has no .safetensors weights for the native runtime")
        tensors: dict[str, torch.Tensor] = {}
        try:
            for file in files:
                tensors.update(load_file(file))
            decoder = Decoder.from_state_dict(
                config, tensors, min(capacity, config.max_position_embeddings), activation_bits
            )
        except KeyError as error:
            raise ModelFilesError(f"{path}: weight {error} is missing") from None
        except Exception as error:  # safetensors raises several types for damaged files
            raise ModelFilesError(f"cannot load the weights in {path}: {type(error).__name__}: {error}") from error
        return cls(decoder)

    def new_cache(self, batch_size: int = 1) -> NativeCache:
        return NativeCache(self.decoder.new_cache(batch_size))

    def forward(self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        assert isinstance(cache, NativeCache), "a cache belongs to the runtime that made it"
        return self.decoder.forward(token_ids.cpu(), cache.static, last_only)

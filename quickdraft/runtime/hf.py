"""Runtime over any transformers causal LM whose cache can be cropped (``DynamicCache``)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from quickdraft.errors import ConfigError
from quickdraft.models.loading import load_hf_model
from quickdraft.runtime.base import KVCache, LoadOptions, Runtime
from quickdraft.runtime.device import device_name, model_dtype


class HFCache(KVCache):
    def __init__(self, batch_size: int) -> None:
        from transformers import DynamicCache

        self.batch_size = batch_size
        self.kv = DynamicCache()

    @property
    def lengths(self) -> torch.Tensor:
        return torch.full((self.batch_size,), self.kv.get_seq_length(), dtype=torch.long)

    def truncate(self, lengths: torch.Tensor | int) -> None:
        lengths = torch.as_tensor(lengths).expand(self.batch_size)
        if not bool((lengths == lengths[0]).all()):
            raise NotImplementedError("the transformers runtime keeps one length for all rows")
        to_remove = self.kv.get_seq_length() - int(lengths[0])
        if to_remove < 0:
            raise ValueError(f"cannot truncate a cache of {self.kv.get_seq_length()} tokens to {int(lengths[0])}")
        if to_remove:
            self.kv.crop(-to_remove)  # a negative count removes tokens in transformers 4 and 5 alike


class HFRuntime(Runtime):
    """Wraps a ``PreTrainedModel`` on whatever device and in whatever dtype it was loaded (``load``: fp32 on the CPU,
    bf16 or fp16 on a GPU); logits come back as float32 on that device."""

    name = "transformers"
    provides_hidden = True

    def __init__(self, model: Any, options: LoadOptions = LoadOptions()) -> None:  # noqa: B008 - frozen, shared
        self.model = model.eval()
        config = model.config.get_text_config()  # a multimodal model's positions are its text model's
        lm_head = model.get_output_embeddings().weight  # [V, H]: it reads the last hidden state
        self.vocab_size, self.hidden_size = int(lm_head.shape[0]), int(lm_head.shape[1])
        self.max_context = options.context(int(getattr(config, "max_position_embeddings", None) or 2048))
        with contextlib.suppress(AttributeError):  # a config without the usual names: the cost stays unknown (0)
            kv_heads, head_dim = kv_shape(config)
            self.kv_bytes_per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize
        self.device = model.device
        self.build = f"transformers {transformers_version()} {model.dtype} {device_name(self.device)}".rstrip()
        self.kv_cache_dtype = str(model.dtype).removeprefix("torch.")
        # transformers 5 renamed ``past_key_values`` to ``cache`` (the old name warns, then goes); 4.x has the old one
        self.cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @classmethod
    def load(cls, path: Path, options: LoadOptions = LoadOptions()) -> HFRuntime:  # noqa: B008 - frozen, shared
        check_default(options)
        return cls(load_hf_model(path, dtype=model_dtype(options.device)).to(options.device), options)

    @classmethod
    def load_sharing(
        cls,
        path: Path,
        transformers_model: Callable[[], Any],
        options: LoadOptions = LoadOptions(),  # noqa: B008 - frozen, shared
    ) -> HFRuntime:
        check_default(options)
        return cls(transformers_model().to(options.device, model_dtype(options.device)), options)

    def new_cache(self, batch_size: int = 1) -> HFCache:
        return HFCache(batch_size)

    @torch.inference_mode()
    def fill_placeholder(self, cache: KVCache, num_tokens: int) -> None:
        """Zero keys and values at the next ``num_tokens`` positions of every layer (see :class:`Runtime`)."""
        assert isinstance(cache, HFCache), "a cache belongs to the runtime that made it"
        config = self.model.config.get_text_config()
        kv_heads, head_dim = kv_shape(config)
        shape = (cache.batch_size, kv_heads, num_tokens, head_dim)  # [B, kv_heads, n, head_dim]
        for layer in range(config.num_hidden_layers):
            keys, values = (torch.zeros(shape, dtype=self.model.dtype, device=self.device) for _ in range(2))
            cache.kv.update(keys, values, layer)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        return self._run(token_ids, cache, last_only, hidden=False).logits.float()  # [B, K, V]

    @torch.inference_mode()
    def forward_with_hidden(
        self, token_ids: torch.Tensor, cache: KVCache, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        output = self._run(token_ids, cache, last_only, hidden=True)
        hidden = output.hidden_states[-1]  # [B, K, H] after the final norm
        return output.logits.float(), (hidden[:, -1:] if last_only else hidden).float()

    def _run(self, token_ids: torch.Tensor, cache: KVCache, last_only: bool, hidden: bool) -> Any:
        assert isinstance(cache, HFCache), "a cache belongs to the runtime that made it"
        return self.model(
            input_ids=token_ids.to(self.device),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            output_hidden_states=hidden,
            **{self.cache_argument: cache.kv},
        )


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def check_default(options: LoadOptions) -> None:
    """The transformers runtime runs a model's float weights in :func:`model_dtype`, its cache in that dtype too: a
    KV cache dtype other than that one, and every other trade of the native runtime, is an error naming its
    setting."""
    held = str(model_dtype(options.device)).removeprefix("torch.")
    asked = {
        "weights": (options.weights != LoadOptions().weights, f"the weight format {options.weights}"),
        "vocabulary": (options.vocabulary is not None, "a vocabulary subset"),
        "kv_cache_dtype": (options.kv_cache_dtype not in (None, held), f"a KV cache of {options.kv_cache_dtype}"),
    }
    for setting, (is_asked, what) in asked.items():
        if is_asked:
            raise ConfigError(
                f"{what} needs the native runtime: the transformers runtime runs a model's own weights, here in "
                f"{held}, and its cache holds that dtype",
                setting,
            )
    settings = replace(options, device=LoadOptions().device, progress=False, kv_cache_dtype=None, max_context=None)
    if settings != LoadOptions():
        raise ConfigError(f"the transformers runtime takes no load options but the device, got {options}")


def kv_shape(config: Any) -> tuple[int, int]:
    """A text config's key-value heads and head size."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return kv_heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

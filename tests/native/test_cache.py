"""The native KV cache: float16 by default or float32 as a load option, its positions capped as another, and its
memory: no transparent huge pages, where every (layer, head) span would take 2 MB."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import native_from_hf, tiny_model

from quickdraft.errors import ConfigError
from quickdraft.runtime import HFRuntime, NativeRuntime
from quickdraft.runtime.base import LoadOptions


def vm_flags(address: int) -> list[str]:
    """The flags of the mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(bound, 16) for bound in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and smaps are Linux's")
def test_cache_memory_takes_no_huge_pages() -> None:
    runtime = native_from_hf(tiny_model(32, seed=0), capacity=4096)
    cache = runtime.new_cache(1)
    for tensor in (cache.static.keys, cache.static.values):
        assert "nh" in vm_flags(tensor.data_ptr())  # MADV_NOHUGEPAGE


def test_a_cache_counts_the_whole_pages_its_positions_reach() -> None:
    """Each (layer, head)'s keys and values are a span of their own: a few positions take whole pages of each."""
    import mmap

    runtime = native_from_hf(tiny_model(32, seed=0), capacity=4096)
    config, page = runtime.decoder.config, mmap.PAGESIZE
    spans = 2 * config.num_layers * config.num_kv_heads
    assert runtime.cache_bytes(0) == 0
    assert runtime.cache_bytes(1) == spans * 2 * page  # a page of the position, one more where a span starts mid-page
    assert runtime.cache_bytes(1) > 1 * runtime.kv_bytes_per_token
    positions = 100 * page // (config.head_dim * 4)  # a hundred pages of values in each span
    assert runtime.cache_bytes(positions) <= positions * runtime.kv_bytes_per_token + spans * 2 * page


def test_the_kv_cache_holds_float16_unless_float32_is_asked_for(native_model_dirs: dict) -> None:
    """Half the bytes a position, another build (what calibrations are keyed by), and logits close to a float32
    cache's; a dtype it does not hold, or any on the transformers runtime, is a clear error."""
    path = native_model_dirs["target"]
    half, wide = NativeRuntime.load(path), NativeRuntime.load(path, LoadOptions(kv_cache_dtype="float32"))
    caches = half.new_cache(1), wide.new_cache(1)
    assert [cache.static.keys.dtype for cache in caches] == [torch.float16, torch.float32]
    assert [cache.static.values.dtype for cache in caches] == [torch.float16, torch.float32]
    assert (half.kv_cache_dtype, wide.kv_cache_dtype) == ("float16", "float32") and half.build != wide.build
    assert wide.kv_bytes_per_token == 2 * half.kv_bytes_per_token
    token_ids = torch.randint(0, half.vocab_size, (1, 24), generator=torch.Generator().manual_seed(3))
    logits = [runtime.forward(token_ids, cache) for runtime, cache in zip((half, wide), caches, strict=True)]
    assert (logits[0] - logits[1]).abs().max() < 0.02 * logits[1].abs().max()
    with pytest.raises(ConfigError, match="unknown KV cache dtype 'bfloat16'; choose one of: float16, float32") as bad:
        NativeRuntime.load(path, LoadOptions(kv_cache_dtype="bfloat16"))
    assert bad.value.setting == "kv_cache_dtype"
    with pytest.raises(ConfigError, match="a KV cache of float16 needs the native runtime"):
        HFRuntime.load(path, LoadOptions(kv_cache_dtype="float16"))
    assert HFRuntime.load(path, LoadOptions(kv_cache_dtype="float32")).kv_cache_dtype == "float32"  # what it holds


def test_a_context_cap_bounds_what_either_runtime_holds(native_model_dirs: dict) -> None:
    """``max_context`` caps the model's declared context (512 positions here): its RoPE tables and caches hold no
    more, and a request is checked against it; a cap past the declared context leaves the declared one (the
    pipeline refuses it for the target); anything but a whole number >= 1 is refused by name."""
    path = native_model_dirs["target"]
    capped = NativeRuntime.load(path, LoadOptions(max_context=40))
    assert capped.max_context == 40 and capped.new_cache(1).static.capacity == 40
    assert all(cos.shape[0] == 40 for cos, _ in capped.decoder.layer_rope)
    whole = NativeRuntime.load(path)
    token_ids = torch.randint(0, whole.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    assert torch.equal(capped.forward(token_ids, capped.new_cache(1)), whole.forward(token_ids, whole.new_cache(1)))
    with pytest.raises(ValueError, match="the cache holds 40 positions"):
        capped.forward(torch.cat([token_ids, token_ids[:, :1]], dim=1), capped.new_cache(1))
    assert NativeRuntime.load(path, LoadOptions(max_context=10**6)).max_context == whole.max_context == 512
    assert HFRuntime.load(path, LoadOptions(max_context=40)).max_context == 40
    for bad in (0, -1, True, 1.5, "40"):
        with pytest.raises(ConfigError, match="max_context is a number of positions >= 1") as raised:
            LoadOptions(max_context=bad)
        assert raised.value.setting == "max_context"

"""The native decoder's static KV cache: preallocated per layer, rolled back by moving a length."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys

import torch

from quickdraft.runtime.names import KV_CACHE_DTYPES
from quickdraft.runtime.native.config import DecoderConfig

Slots = list[torch.Tensor]  # per cache slot (a request's row), its keys or values (StaticKVCache.slots)

KEY_BLOCK = 16  # keys are kept in blocks of 16 positions, transposed (attention.h)
KV_DTYPES = {name: getattr(torch, name) for name in KV_CACHE_DTYPES}  # what a cache may hold keys and values as
NO_HUGE_PAGES = getattr(mmap, "MADV_NOHUGEPAGE", None)  # Linux's
LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class StaticKVCache:
    """Preallocated keys ``[layers, B, kv_heads, C/16, head_dim, 16]`` (blocks of 16 positions, transposed) and values
    ``[layers, B, kv_heads, C, head_dim]``, float32 or float16 (``dtype``: a written key or value is rounded to the
    nearest half, and read back as that half's float); rollback moves a length.

    A row's positions at or past its length are never read (a query at position p attends to 0..p, all written
    before it), so the tensors start uninitialized: the memory of positions no token reaches is never touched, nor
    zeroed or freed position by position. Their memory takes no transparent huge pages: every (layer, head) has its
    own span, and where the system gives huge pages to all memory, a few tokens would take 2 MB in each.
    """

    def __init__(self, config: DecoderConfig, batch_size: int, capacity: int, dtype: torch.dtype) -> None:
        if dtype not in KV_DTYPES.values():
            raise ValueError(f"a KV cache holds float32 or float16, not {dtype}")
        blocks = -(-capacity // KEY_BLOCK)
        prefix = (config.num_layers, batch_size, config.num_kv_heads)
        self.keys = torch.empty(*prefix, blocks, config.head_dim, KEY_BLOCK, dtype=dtype)
        self.values = torch.empty(*prefix, blocks * KEY_BLOCK, config.head_dim, dtype=dtype)
        for tensor in (self.keys, self.values):
            no_huge_pages(tensor)
        self.lengths = torch.zeros(batch_size, dtype=torch.long)  # [B]
        self.capacity = capacity

    def slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each row's keys ``[layers, kv_heads, C/16, D, 16]`` and values ``[layers, kv_heads, C, D]`` (views: what the
        kernels address by slot)."""
        rows = range(self.keys.shape[1])
        return [self.keys[:, row] for row in rows], [self.values[:, row] for row in rows]

    def move(self, row: int, source: int, target: int) -> None:
        """Copy row ``row``'s keys and values at index ``source`` to position ``target`` in every layer: an accepted
        tree leaf, kept past its verify block, into its place (``Decoder.forward_tree``)."""
        (source_block, source_lane), (target_block, target_lane) = divmod(source, KEY_BLOCK), divmod(target, KEY_BLOCK)
        self.keys[:, row, :, target_block, :, target_lane] = self.keys[:, row, :, source_block, :, source_lane]
        self.values[:, row, :, target] = self.values[:, row, :, source]


def no_huge_pages(tensor: torch.Tensor) -> None:
    """Ask the kernel for no transparent huge pages in ``tensor``'s memory (from the start of its first page); where it
    cannot be asked, nothing changes."""
    if LIBC is None or NO_HUGE_PAGES is None or tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    start = tensor.data_ptr() - tensor.data_ptr() % mmap.PAGESIZE
    end = tensor.data_ptr() + tensor.numel() * tensor.element_size()
    with contextlib.suppress(OSError, AttributeError):
        LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), NO_HUGE_PAGES)


def key_rows(keys: torch.Tensor, length: int) -> torch.Tensor:
    """One layer's blocked keys ``[kv_heads, C/16, D, 16]`` -> positions 0..length-1, ``[kv_heads, length, D]``."""
    kv_heads, blocks, head_dim, _ = keys.shape
    return keys.transpose(-1, -2).reshape(kv_heads, blocks * KEY_BLOCK, head_dim)[:, :length]

"""attention.h on every instruction set this machine runs (AVX-512, AVX2, plain C++): each build's result is softmax
attention to float error, rows attended together have the bits of each row alone, positions past a row's length
or before its sliding window are never used, whatever they hold (NaN included), a tree's leaf, its key and value
kept past the block, has the bits of a chain row holding its token at its position, weights too small for a
normal float count as zero, in the call alone, and a float16 cache gives the bits of a float32 one holding the same
values."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from test_gemm import compile_capi, isa_builds, pointer

KEY_BLOCK = 16


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ctypes.CDLL]:
    builds = {"avx512" if name.startswith("avx512") else name: flags for name, flags in isa_builds().items()}
    builds.pop("avx-vnni", None)  # attention has no AVX-VNNI path: that build is the AVX2 one
    return compile_capi("attention_capi.cpp", builds, tmp_path_factory.mktemp("attention"), "attention_isa")


def blocked_keys(keys: torch.Tensor) -> torch.Tensor:
    """Keys [C, D] (C a multiple of 16) -> the cache's layout [C/16, D, 16]."""
    positions, head_dim = keys.shape
    return keys.reshape(positions // KEY_BLOCK, KEY_BLOCK, head_dim).transpose(1, 2).contiguous()


def attend(library: ctypes.CDLL, together: bool, q: torch.Tensor, lengths: list[int], keys: torch.Tensor,
           values: torch.Tensor, scale: float, skips: list[int] | None = None,
           cap: float = 0.0, owns: list[int] | None = None) -> torch.Tensor:  # fmt: skip
    rows, heads, head_dim = q.shape
    out = torch.full_like(q, math.nan)
    length_array = (ctypes.c_int64 * rows)(*lengths)
    skip_array = (ctypes.c_int64 * rows)(*(skips or [0] * rows))
    own_array = (ctypes.c_int64 * rows)(*(owns or [-1] * rows))
    half = "_half" if keys.dtype == torch.float16 else ""  # a float16 cache's entry points
    function = getattr(library, f"attend_together{half}" if together else f"attend_alone{half}")
    blocked = blocked_keys(keys)  # held while the call reads it
    function(pointer(q), skip_array, length_array, own_array, ctypes.c_int64(rows), ctypes.c_int64(heads),
             pointer(blocked), pointer(values), ctypes.c_int64(head_dim), ctypes.c_float(scale), ctypes.c_float(cap),
             pointer(out))  # fmt: skip
    return out


@pytest.mark.parametrize("head_dim", [128, 12])  # the default pair's, and one that ends inside a vector
def test_every_attention_build_is_exact_and_keeps_to_each_rows_positions(libraries, head_dim: int) -> None:
    generator = torch.Generator().manual_seed(7)
    positions, heads = 640, 9  # 640: past two tiles of 256 keys; 9 heads: a group of 8 and one more
    keys, values = (torch.randn(positions, head_dim, generator=generator) for _ in range(2))
    lengths = [*range(300, 318), 1, 17, 600]  # a verify block of 18 rows (two runs of 16), and others
    q = torch.randn(len(lengths), heads, head_dim, generator=generator)
    scale = head_dim**-0.5
    for name, library in libraries.items():
        alone = attend(library, False, q, lengths, keys, values, scale)
        together = attend(library, True, q, lengths, keys, values, scale)
        assert torch.equal(together, alone), name
        for r, length in enumerate(lengths):
            weights = torch.softmax(q[r] @ keys[:length].T * scale, dim=-1)  # [heads, length]
            assert torch.allclose(alone[r], weights @ values[:length], atol=1e-5, rtol=1e-4), (name, r)
            poisoned_keys, poisoned_values = keys.clone(), values.clone()
            poisoned_keys[length:], poisoned_values[length:] = math.nan, math.nan  # from the row's own length on
            poisoned = attend(library, True, q[r : r + 1], [length], poisoned_keys, poisoned_values, scale)
            assert torch.equal(poisoned, alone[r : r + 1]), (name, r)


def test_subnormal_weights_are_zero_and_the_callers_mode_comes_back(libraries) -> None:
    """Scores spread over hundreds (most weights below 2^-126 of the largest) give softmax attention to float error,
    the same bits alone and together; afterwards this thread computes subnormal floats again."""
    generator = torch.Generator().manual_seed(11)
    keys, values = (torch.randn(640, 128, generator=generator) for _ in range(2))
    lengths = [300, 301, 317, 600]
    q = torch.randn(len(lengths), 2, 128, generator=generator) * 60  # scores of standard deviation 60
    scale = 128**-0.5
    for name, library in libraries.items():
        alone = attend(library, False, q, lengths, keys, values, scale)
        assert torch.equal(attend(library, True, q, lengths, keys, values, scale), alone), name
        for r, length in enumerate(lengths):
            weights = torch.softmax(q[r] @ keys[:length].T * scale, dim=-1)
            assert (weights < torch.finfo(torch.float32).tiny).float().mean() > 0.5  # most weights are subnormal
            assert torch.allclose(alone[r], weights @ values[:length], atol=1e-5, rtol=1e-4), (name, r)
        assert (torch.tensor([1e-38]) / 4).item() > 0, name  # the thread's mode is its own again


@pytest.mark.parametrize("head_dim", [128, 12])
def test_softcapped_scores_are_gemma_2s(libraries, head_dim: int) -> None:
    """cap · tanh(s / cap) before the softmax, the same bits alone and together, with and without a window."""
    generator = torch.Generator().manual_seed(9)
    keys, values = (torch.randn(640, head_dim, generator=generator) * 3 for _ in range(2))
    lengths, skips = [300, 301, 317, 600], [0, 5, 0, 3]
    q = torch.randn(len(lengths), 3, head_dim, generator=generator) * 3  # large scores: the cap matters
    scale, cap = head_dim**-0.5, 5.0
    for name, library in libraries.items():
        alone = attend(library, False, q, lengths, keys, values, scale, skips, cap)
        assert torch.equal(attend(library, True, q, lengths, keys, values, scale, skips, cap), alone), name
        for r, (skip, length) in enumerate(zip(skips, lengths, strict=True)):
            scores = q[r] @ keys[skip:length].T * scale
            weights = torch.softmax(torch.tanh(scores / cap) * cap, dim=-1)
            assert torch.allclose(alone[r], weights @ values[skip:length], atol=1e-5, rtol=1e-4), (name, r)


@pytest.mark.parametrize("head_dim", [128, 12])
def test_a_sliding_window_leaves_out_the_positions_before_it(libraries, head_dim: int) -> None:
    generator = torch.Generator().manual_seed(8)
    positions, heads = 640, 3
    keys, values = (torch.randn(positions, head_dim, generator=generator) for _ in range(2))
    lengths = [300, 301, 317, 600, 17]
    skips = [0, 5, 15, 3, 16]  # within the first block the keys start from (16: a whole block, the edge case)
    q = torch.randn(len(lengths), heads, head_dim, generator=generator)
    scale = head_dim**-0.5
    for name, library in libraries.items():
        alone = attend(library, False, q, lengths, keys, values, scale, skips)
        together = attend(library, True, q, lengths, keys, values, scale, skips)
        assert torch.equal(together, alone), name
        for r, (skip, length) in enumerate(zip(skips, lengths, strict=True)):
            weights = torch.softmax(q[r] @ keys[skip:length].T * scale, dim=-1)  # [heads, length - skip]
            assert torch.allclose(alone[r], weights @ values[skip:length], atol=1e-5, rtol=1e-4), (name, r)
            poisoned_keys, poisoned_values = keys.clone(), values.clone()
            poisoned_keys[:skip], poisoned_values[:skip] = math.nan, math.nan
            poisoned = attend(library, True, q[r : r + 1], [length], poisoned_keys, poisoned_values, scale, [skip])
            assert torch.equal(poisoned, alone[r : r + 1]), (name, r)


@pytest.mark.parametrize("head_dim", [128, 12])
def test_a_leaf_has_the_bits_of_a_chain_row_holding_its_token(libraries, head_dim: int) -> None:
    """A leaf at position p keeps its key and value at index own past the block; it sees 0..p - 1 and then itself, in
    every build, alone and beside chain rows, with a window and a softcap too."""
    generator = torch.Generator().manual_seed(10)
    positions, heads, scale = 640, 9, head_dim**-0.5
    keys, values = (torch.randn(positions, head_dim, generator=generator) for _ in range(2))
    leaf_lengths, owns = [300, 301, 316, 17, 1], [330, 600, 639, 400, 20]  # p + 1 = length; own anywhere past
    for skips, cap in (([0] * 5, 0.0), ([5, 0, 15, 16, 0], 4.0)):
        q = torch.randn(len(leaf_lengths), heads, head_dim, generator=generator)
        for name, library in libraries.items():
            leaves = attend(library, True, q, leaf_lengths, keys, values, scale, skips, cap, owns)
            chain_keys, chain_values = keys.clone(), values.clone()
            for r, (length, own) in enumerate(zip(leaf_lengths, owns, strict=True)):
                chain_keys[length - 1], chain_values[length - 1] = keys[own], values[own]  # the leaf's token at p
                chain = attend(
                    library, False, q[r : r + 1], [length], chain_keys, chain_values, scale, skips[r : r + 1], cap
                )
                assert torch.equal(leaves[r : r + 1], chain), (name, r)
                alone = attend(
                    library, False, q[r : r + 1], [length], keys, values, scale, skips[r : r + 1], cap, [own]
                )
                assert torch.equal(alone, chain), (name, r)
                chain_keys[length - 1], chain_values[length - 1] = keys[length - 1], values[length - 1]


@pytest.mark.parametrize("head_dim", [128, 12])
def test_a_float16_cache_gives_the_bits_of_a_float32_one_holding_its_values(libraries, head_dim: int) -> None:
    """Every build widens each half exactly and then does the float cache's arithmetic: the same bits alone and
    together, in chain rows and leaves, with a window and a softcap, for halves of every kind (subnormal, the
    largest, zeros of both signs)."""
    generator = torch.Generator().manual_seed(12)
    positions, heads, scale = 640, 9, head_dim**-0.5
    keys, values = (torch.randn(positions, head_dim, generator=generator) * 4 for _ in range(2))
    keys[3, :4] = torch.tensor([6.0e-8, -3.0e-6, 65504.0 / 1024, -0.0])  # subnormal halves; large ones stay finite
    values[5, :4] = torch.tensor([6.0e-8, -3.0e-6, 65504.0, -0.0])
    half_keys, half_values = keys.half(), values.half()
    wide_keys, wide_values = half_keys.float(), half_values.float()
    lengths, skips, owns = [300, 301, 316, 17, 1, 600], [0, 5, 15, 16, 0, 3], [-1, 600, -1, 400, 20, -1]
    q = torch.randn(len(lengths), heads, head_dim, generator=generator)
    for cap in (0.0, 4.0):
        for name, library in libraries.items():
            for together in (False, True):
                half = attend(library, together, q, lengths, half_keys, half_values, scale, skips, cap, owns)
                wide = attend(library, together, q, lengths, wide_keys, wide_values, scale, skips, cap, owns)
                assert torch.equal(half, wide) and not half.isnan().any(), (name, together, cap)

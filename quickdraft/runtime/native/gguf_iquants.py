"""A GGUF file's i-quant tensors (IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) as the native
runtime's iq4, iq4h and q6 parts, bit for bit (no second quantization). IQ4_NL has Q4_0's block structure and is
read with it (``gguf_blocks.py``).

IQ4_XS (``block_iq4_xs``, 136 bytes per 256 weights): a float16 ``d``, the high 2 bits of eight 6-bit sub-scales
in a uint16 ``scales_h`` (bits 2g, 2g + 1: group g), their low 4 bits in 4 bytes ``scales_l`` (group g in the low
nibble of byte g/2 for even g, the high one for odd g), then 128 bytes of 4-bit indices into llama.cpp's
``kvalues_iq4nl``, 16 bytes a group of 32 as Q4_0's; weight = d · (sub_scale − 32) · value: the iq4 format.

The IQ3 types hold each group of 32 weights as 8 grid indices, each naming 4 magnitudes in llama.cpp's grid of its
type (gguf-py's copy: ``grid_values``), their signs and a 4-bit sub-scale ls, under a float16 ``d`` per 256:

- IQ3_XXS (``block_iq3_xxs``, 98 bytes): ``d``, 64 bytes of 8-bit indices (grid entries of {4, 12, ..., 52, 62}),
  then a little-endian uint32 per group: four 7-bit sign indices (bits 7k: weights 8k..8k + 7), each into
  ``SIGNS`` (the eighth sign makes the count of minus signs even), and ls in its top 4 bits. weight =
  d · (0.5 + ls) · 0.5 · sign · magnitude, which is exactly (d/2) · (2·ls + 1) · (sign · magnitude/2).
- IQ3_S (``block_iq3_s``, 110 bytes): ``d``, 64 bytes of the indices' low 8 bits, 8 bytes of their ninth bits (bit
  i mod 8 of byte i/8 for index i), 32 bytes of signs (bit b of byte k: weight 8k + b), 4 bytes of sub-scales (group
  2k in the low nibble of byte k, 2k + 1 in the high one); magnitudes {1, 3, ..., 15}; weight =
  d · (1 + 2·ls) · sign · magnitude.

Both are the q6 format's w = d · sub_scale · (code − 32), with sub-scale 2·ls + 1 (each group's for its two
sub-blocks of 16) and code − 32 the signed value in [−31, 31]; d/2 of a float16 is a float32 exactly.

IQ2_XXS (``block_iq2_xxs``, 66 bytes per 256): ``d``, then per group of 32 two little-endian uint32: the first's four
bytes are indices into llama.cpp's ``iq2xxs_grid`` (8 magnitudes of {8, 25, 43} each: weights 8k..8k + 7), the
second IQ3_XXS's signs and ls. weight = d · (0.5 + ls) · 0.25 · sign · magnitude, which is exactly
(d/8) · (2·ls + 1) · (sign · magnitude): the iq4 format with the six signed magnitudes as its table
(``IQ2_VALUES``), sub-scale 2·ls + 1 and d/8, again a float32 exactly. IQ2_XS (``block_iq2_xs``, 74 bytes: a uint16
per 8 weights, 9 bits of grid index and 7 of sign index, then 8 scale bytes) and IQ2_S (``block_iq2_s``, 82 bytes:
10-bit indices into a grid of 1024, a sign bit per weight, 8 scale bytes) have the same magnitudes and weight formula
with a 4-bit ls per 16 weights: the iq4h format.

IQ1_S (``block_iq1_s``, 50 bytes: ``d``, 32 bytes of the low 8 bits of 11-bit indices into a grid of 2048 entries of
eight values from {−1, 0, 1}, then a uint16 per group: the indices' top 3 bits, a 3-bit ls and a sign bit s) holds
weight = d · (2·ls + 1) · (value + δ), δ = ±1/8 by s. That is exactly (d/8) · (2·ls + 1) · (8·value ± 1), six
integers ±1, ±7, ±9 (``IQ1_VALUES``): the iq4 format. IQ1_M (``block_iq1_m``, 56 bytes: the indices' low bytes, a
nibble per index with its top 3 bits and δ's sign, then four uint16 holding a 3-bit ls per 16 weights and, in their
top nibbles, the float16 d) is the same with ls per 16 weights and δ per 8: the iq4h format.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import torch

from quickdraft.runtime.native.gguf_blocks import Q4_K_WEIGHTS, ExactWeight, float16_at, nibbles_of
from quickdraft.runtime.native.iquants import IQ1_VALUES, IQ2_VALUES, IQ4_VALUES
from quickdraft.runtime.native.kquants import Q6_OFFSET
from quickdraft.runtime.native.parts import row_chunks

IQ4_XS_BLOCK_BYTES = 136
IQ4_XS_SCALE_OFFSET = 32  # IQ4_XS's 6-bit sub-scales hold sub_scale + 32
IQ3_XXS_BLOCK_BYTES = 98
IQ3_S_BLOCK_BYTES = 110
IQ2_XXS_BLOCK_BYTES = 66
GROUPS = Q4_K_WEIGHTS // 32  # groups of 32 weights per superblock
# The sign bytes of a 7-bit index i: its bits, and an eighth bit that makes the count of set bits even (llama.cpp's
# ksigns_iq2xs)
SIGNS = np.array([i | (bin(i).count("1") & 1) << 7 for i in range(128)], dtype=np.uint8)


@cache
def grid_values(name: str) -> np.ndarray:
    """llama.cpp's grid of the IQ type ``name`` as gguf-py builds it: ``[entries, magnitudes]`` int8 (4 magnitudes an
    entry for IQ3, 8 for IQ2)."""
    from gguf import quants

    kind = getattr(quants, name)
    kind.init_grid()
    return np.asarray(kind.grid).reshape(kind.grid_shape).astype(np.int8)


def decode_iq4_xs(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ4_XS bytes -> ("iq4", (codes [rows, width] uint8 in [0, 15], table [rows, 16] (``IQ4_VALUES``),
    sub_scale [rows, width/32] int8 in [−32, 31], d [rows, width/256] float32))."""
    supers = width // Q4_K_WEIGHTS
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, supers, IQ4_XS_BLOCK_BYTES)
    high = blocks[..., 2:4].copy().view("<u2")  # [rows, S, 1]
    high_bits = (high >> (2 * np.arange(8, dtype=np.uint16))) & 3  # [rows, S, 8]
    low_bits = nibbles_of(blocks[..., 4:8]).reshape(rows, supers, 2, 4).transpose(0, 1, 3, 2)  # [rows, S, 4, 2]
    scales = low_bits.reshape(rows, supers, 8).astype(np.int16) | (high_bits.astype(np.int16) << 4)
    codes = nibbles_of(blocks[..., 8:].reshape(rows, supers, 8, 16))  # [rows, S, 8, 32]
    sub_scale = (scales - IQ4_XS_SCALE_OFFSET).astype(np.int8).reshape(rows, -1)
    return "iq4", (
        torch.from_numpy(codes.reshape(rows, width)),
        IQ4_VALUES.expand(rows, 16),
        torch.from_numpy(sub_scale),
        torch.from_numpy(float16_at(blocks, 0)),
    )


def signed_codes(magnitudes: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """Magnitudes in [0, 31] and their signs (``minus`` 1: negative), of one shape -> q6 codes (value + 32)."""
    return (Q6_OFFSET + np.where(minus == 1, -magnitudes.astype(np.int16), magnitudes)).astype(np.uint8)


def sign_bits(signs: np.ndarray) -> np.ndarray:
    """Sign bytes ``[..., n]`` -> their bits ``[..., 8n]``: bit b of byte k is weight 8k + b's (1: negative)."""
    return np.unpackbits(signs, axis=-1, bitorder="little")


def word_signs(words: np.ndarray) -> np.ndarray:
    """IQ3_XXS's and IQ2_XXS's per-group uint32 ``[n, S, 8]`` -> its weights' signs ``[n, S, 256]`` (1: negative):
    four 7-bit sign indices (bits 7k: weights 8k..8k + 7) into ``SIGNS``."""
    sign_index = (words[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 0x7F  # [n, S, 8, 4]
    return sign_bits(SIGNS[sign_index]).reshape(*words.shape[:2], Q4_K_WEIGHTS)


def iq3_xxs_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ3_XXS blocks ``[n, S, 98]`` -> (q6 codes ``[n, S, 256]`` of value/2, group sub-scales ``[n, S, 8]``)."""
    magnitudes = grid_values("IQ3_XXS")[blocks[..., 2:66]] // 2  # [n, S, 64, 4]: {2, 6, ..., 26, 31}
    words = blocks[..., 66:98].copy().view("<u4")  # [n, S, 8]
    minus = word_signs(words)
    return signed_codes(magnitudes.reshape(minus.shape), minus), 2 * (words >> 28) + 1


def iq3_s_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ3_S blocks ``[n, S, 110]`` -> (q6 codes ``[n, S, 256]``, group sub-scales ``[n, S, 8]``)."""
    ninth = sign_bits(blocks[..., 66:74]).astype(np.uint16) << 8  # [n, S, 64]
    magnitudes = grid_values("IQ3_S")[blocks[..., 2:66] | ninth]  # [n, S, 64, 4]: {1, 3, ..., 15}
    minus = sign_bits(blocks[..., 74:106])  # [n, S, 256]
    nibbles = nibbles_of(blocks[..., 106:110]).reshape(*blocks.shape[:2], 2, 4)  # [n, S, low/high, byte k]
    group_scale = 2 * nibbles.swapaxes(-1, -2).reshape(*blocks.shape[:2], GROUPS) + 1  # group 2k: byte k's low one
    return signed_codes(magnitudes.reshape(minus.shape), minus), group_scale


def grid_fields(
    blocks: np.ndarray, codes_of: Callable, width: int, sub_block: int, repeat: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Grid blocks ``[rows, S, bytes]`` -> (codes ``[rows, width]`` uint8, sub_scale ``[rows, width / sub_block]``
    int8), decoded CODE_ROWS rows at a time (the temporaries stay a few MB): ``codes_of`` gives a chunk's codes and
    sub-scales, each sub-scale serving ``repeat`` sub-blocks of the part."""
    rows = len(blocks)
    codes = np.empty((rows, width), np.uint8)
    sub_scale = np.empty((rows, width // sub_block), np.int8)
    for chunk in row_chunks(rows):
        chunk_codes, scales = codes_of(blocks[chunk])
        codes[chunk] = chunk_codes.reshape(len(chunk_codes), width)
        sub_scale[chunk] = np.repeat(scales.astype(np.int8), repeat, axis=-1).reshape(len(chunk_codes), -1)
    return codes, sub_scale


def grid_q6(blocks: np.ndarray, codes_of: Callable, d: np.ndarray, width: int) -> ExactWeight:
    """IQ3 blocks ``[rows, S, bytes]`` as a q6 part's fields: ``codes_of`` gives a chunk's codes and group sub-scales
    (each for its group's two sub-blocks of 16), ``d [rows, S]`` the superblocks' scales."""
    codes, sub_scale = grid_fields(blocks, codes_of, width, 16, repeat=2)
    return "q6", (torch.from_numpy(codes), torch.from_numpy(sub_scale), torch.from_numpy(d.astype(np.float32)))


def decode_iq3_xxs(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ3_XXS bytes -> ("q6", (codes [rows, width] uint8 in [1, 63], sub_scale [rows, width/16] int8 in
    [1, 31], d/2 [rows, width/256] float32))."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // Q4_K_WEIGHTS, IQ3_XXS_BLOCK_BYTES)
    return grid_q6(blocks, iq3_xxs_codes, float16_at(blocks, 0) / 2, width)


def decode_iq3_s(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ3_S bytes -> ("q6", (codes [rows, width] uint8 in [17, 47], sub_scale [rows, width/16] int8 in
    [1, 31], d [rows, width/256] float32))."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // Q4_K_WEIGHTS, IQ3_S_BLOCK_BYTES)
    return grid_q6(blocks, iq3_s_codes, float16_at(blocks, 0), width)


# IQ2_VALUES's code of each signed magnitude: [minus][magnitude index in (8, 25, 43)]
IQ2_CODES = np.array([[3, 4, 5], [2, 1, 0]], dtype=np.uint8)
IQ2_XS_BLOCK_BYTES = 74
IQ2_S_BLOCK_BYTES = 82
IQ1_S_BLOCK_BYTES = 50
IQ1_M_BLOCK_BYTES = 56


def iq2_codes(grid: str, indices: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """Grid indices ``[n, S, 32]`` (each naming 8 magnitudes of the grid ``grid``) and their weights' signs
    ``[n, S, 256]`` -> iq4 codes ``[n, S, 256]`` into ``IQ2_VALUES``."""
    magnitudes = grid_values(grid)[indices].reshape(minus.shape)  # {8, 25, 43}
    return IQ2_CODES[minus, np.searchsorted(np.array([8, 25, 43]), magnitudes)]


def iq2_xxs_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ2_XXS blocks ``[n, S, 66]`` -> (iq4 codes ``[n, S, 256]``, group sub-scales ``[n, S, 8]``)."""
    groups = blocks[..., 2:].reshape(*blocks.shape[:2], GROUPS, 8)  # [n, S, 8, 8]: index bytes, then a word
    words = groups[..., 4:].copy().view("<u4")[..., 0]  # [n, S, 8]
    indices = groups[..., :4].reshape(*blocks.shape[:2], 32)
    return iq2_codes("IQ2_XXS", indices, word_signs(words)), 2 * (words >> 28) + 1


def half_scales(scales: np.ndarray) -> np.ndarray:
    """IQ2_XS's and IQ2_S's 8 scale bytes ``[n, S, 8]`` -> sub-scales 2·ls + 1 per 16 weights ``[n, S, 16]`` (a
    group's first half in the low nibble)."""
    return 2 * nibbles_of(scales[..., None]).reshape(*scales.shape[:2], 16) + 1


def iq2_xs_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ2_XS blocks ``[n, S, 74]`` -> (iq4 codes ``[n, S, 256]``, sub-scales per 16 ``[n, S, 16]``): a uint16 per 8
    weights, a 9-bit grid index and a 7-bit sign index above it, then the scale bytes."""
    words = blocks[..., 2:66].copy().view("<u2")  # [n, S, 32]
    minus = sign_bits(SIGNS[words >> 9]).reshape(*blocks.shape[:2], Q4_K_WEIGHTS)
    return iq2_codes("IQ2_XS", words & 511, minus), half_scales(blocks[..., 66:74])


def iq2_s_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ2_S blocks ``[n, S, 82]`` -> (iq4 codes ``[n, S, 256]``, sub-scales per 16 ``[n, S, 16]``): 32 bytes of the
    grid indices' low 8 bits, 32 sign bytes (bit b of byte k: weight 8k + b), 8 bytes of the indices' top 2 bits
    (bits 2i of byte k: index 4k + i), then the scale bytes."""
    top = (blocks[..., 66:74, None] >> (2 * np.arange(4, dtype=np.uint8))) & 3  # [n, S, 8, 4]
    indices = blocks[..., 2:34].astype(np.uint16) | top.reshape(*blocks.shape[:2], 32).astype(np.uint16) << 8
    return iq2_codes("IQ2_S", indices, sign_bits(blocks[..., 34:66])), half_scales(blocks[..., 74:82])


def iq1_codes(indices: np.ndarray, plus: np.ndarray) -> np.ndarray:
    """11-bit grid indices ``[n, S, 32]`` and δ's sign per index (1: +1/8) -> iq4 codes ``[n, S, 256]`` into
    ``IQ1_VALUES``: 8·value + 1 or − 1 for value in {−1, 0, 1} is code 2·(value + 1) + plus."""
    values = grid_values("IQ1_S")[indices].astype(np.uint8) + 1  # [n, S, 32, 8]: value + 1 in {0, 1, 2}
    return (2 * values + plus[..., None].astype(np.uint8)).reshape(*indices.shape[:2], Q4_K_WEIGHTS)


def iq1_s_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ1_S blocks ``[n, S, 50]`` -> (iq4 codes ``[n, S, 256]``, group sub-scales ``[n, S, 8]``)."""
    words = blocks[..., 34:50].copy().view("<u2")  # [n, S, 8]: per group
    top = (words[..., None] >> (3 * np.arange(4, dtype=np.uint16))) & 7  # [n, S, 8, 4]
    indices = blocks[..., 2:34].astype(np.uint16) | top.reshape(*blocks.shape[:2], 32) << 8
    plus = np.repeat((words >> 15) == 0, 4, axis=-1)  # [n, S, 32]: each group's sign for its 4 indices
    return iq1_codes(indices, plus), 2 * ((words >> 12) & 7) + 1


def iq1_m_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ1_M blocks ``[n, S, 56]`` -> (iq4 codes ``[n, S, 256]``, sub-scales per 16 ``[n, S, 16]``)."""
    nibbles = nibbles_of(blocks[..., 32:48, None]).reshape(*blocks.shape[:2], 32)  # index 2b: byte b's low nibble
    indices = blocks[..., :32].astype(np.uint16) | (nibbles & 7).astype(np.uint16) << 8
    words = blocks[..., 48:56].copy().view("<u2")  # [n, S, 4]
    scales = (words[..., None] >> (3 * np.arange(4, dtype=np.uint16))) & 7  # [n, S, 4, 4]: 16 in k order
    return iq1_codes(indices, (nibbles & 8) == 0), 2 * scales.reshape(*blocks.shape[:2], 16) + 1


def iq1_m_d(blocks: np.ndarray) -> np.ndarray:
    """IQ1_M blocks ``[n, S, 56]`` -> their float16 d ``[n, S]``, held in the top nibbles of the four scale words."""
    words = blocks[..., 48:56].copy().view("<u2")  # [n, S, 4]
    d_bits = (words & 0xF000) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    return np.bitwise_or.reduce(d_bits, axis=-1).view(np.float16).astype(np.float32)


def first_float16(blocks: np.ndarray) -> np.ndarray:
    """The float16 d at the start of each block ``[n, S, bytes]`` (every grid type's but IQ1_M's)."""
    return float16_at(blocks, 0)


def grid_iq4(
    raw: np.ndarray,
    rows: int,
    width: int,
    block_bytes: int,
    codes_of: Callable,
    sub_block: int,
    table: torch.Tensor,
    d_of: Callable = first_float16,
) -> ExactWeight:
    """IQ2 and IQ1 blocks as an iq4 (``sub_block`` 32) or iq4h (16) part's fields with ``table``: ``codes_of`` gives
    a chunk's codes and sub-scales (:func:`grid_fields`), ``d_of`` the blocks' d; the superblock scale is d/8."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // Q4_K_WEIGHTS, block_bytes)
    codes, sub_scale = grid_fields(blocks, codes_of, width, sub_block)
    kind = "iq4" if sub_block == 32 else "iq4h"
    d = torch.from_numpy(d_of(blocks) / 8)
    return kind, (torch.from_numpy(codes), table.expand(rows, 16), torch.from_numpy(sub_scale), d)


def decode_iq2_xxs(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ2_XXS bytes -> ("iq4", (codes [rows, width] uint8 in [0, 5], table [rows, 16] (``IQ2_VALUES``),
    sub_scale [rows, width/32] int8 in [1, 31], d/8 [rows, width/256] float32))."""
    return grid_iq4(raw, rows, width, IQ2_XXS_BLOCK_BYTES, iq2_xxs_codes, 32, IQ2_VALUES)


def decode_iq2_xs(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ2_XS bytes -> ("iq4h", (codes, table, sub_scale [rows, width/16] int8 in [1, 31], d/8)), as IQ2_XXS's."""
    return grid_iq4(raw, rows, width, IQ2_XS_BLOCK_BYTES, iq2_xs_codes, 16, IQ2_VALUES)


def decode_iq2_s(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ2_S bytes -> ("iq4h", (codes, table, sub_scale [rows, width/16] int8 in [1, 31], d/8)), as IQ2_XXS's."""
    return grid_iq4(raw, rows, width, IQ2_S_BLOCK_BYTES, iq2_s_codes, 16, IQ2_VALUES)


def decode_iq1_s(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ1_S bytes -> ("iq4", (codes [rows, width] uint8 in [0, 5], table [rows, 16] (``IQ1_VALUES``),
    sub_scale [rows, width/32] int8 in [1, 15], d/8 [rows, width/256] float32))."""
    return grid_iq4(raw, rows, width, IQ1_S_BLOCK_BYTES, iq1_s_codes, 32, IQ1_VALUES)


def decode_iq1_m(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ1_M bytes -> ("iq4h", (codes, table (``IQ1_VALUES``), sub_scale [rows, width/16] int8 in [1, 15], d/8))."""
    return grid_iq4(raw, rows, width, IQ1_M_BLOCK_BYTES, iq1_m_codes, 16, IQ1_VALUES, iq1_m_d)

"""A GGUF file's 4-bit float tensors (MXFP4, NVFP4): 4-bit codes into e2m1's values, doubled (``kvalues_mxfp4``: 0,
±1, ±2, ±3, ±4, ±6, ±8, ±12; ``E2M1_TABLE``), under a power-of-two or small float scale per block. Both load exactly
into parts with a table of their own, as long as the part's scales hold the file's; a tensor with a block they do not
hold is read as floats (7 bits) instead (``gguf_exact.DECODES_WHEN`` names the checks).

MXFP4 (``block_mxfp4``, 17 bytes per 32 weights): an E8M0 exponent byte e, then Q4_0's nibbles (weight l the low
nibble of byte l, weight l + 16 its high nibble); weight = 2^(e − 128) · value (gguf-py's ``e8m0_to_fp32_half``,
2^(e − 127) halved for the doubled values). That is q4t with the table and d = 2^(e − 128), which q4t's float16 d
holds exactly for e in [104, 143] (``MXFP4_EXPONENTS``); a block whose codes all name zero (0 and 8) takes d 0 whatever
its e (llama.cpp's quantizer writes e = 0 there).

NVFP4 (36 bytes per 64 weights): four unsigned E4M3 scale bytes, one per 16 weights, then 8 bytes of nibbles per 16
(weight i the low nibble of byte i, weight 8 + i its high nibble); weight = s · value with s gguf-py's
``ue4m3_to_fp32`` (halved as MXFP4's): for a byte's low 7 bits b, exponent E = b >> 3 and mantissa m = b & 7,
s = (8 + m) · 2^(E − 11), or m · 2^(1 − 11) where E = 0, and 0 for the byte 0x7F (0xFF reads as 240). Every s is
c · 2^k with c odd (or 0) below 16, so a superblock of 256 weights whose scales share a power 2^k0 with
c · 2^(k − k0) ≤ 127 each is exactly the iq4h format: d = 2^k0, sub_scale = c · 2^(k − k0), the table above
(``nvfp4_fits``: every superblock does).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from quickdraft.runtime.native.gguf_blocks import LEGACY_WEIGHTS, Q4_K_WEIGHTS, ExactWeight, nibbles_of
from quickdraft.runtime.native.q4tables import E2M1_TABLE

MXFP4_BLOCK_BYTES = 17
MXFP4_EXPONENTS = (104, 143)  # the E8M0 bytes e whose 2^(e − 128) is a float16 value
NVFP4_BLOCK_BYTES = 36
NVFP4_WEIGHTS = 64
NVFP4_SUB_BLOCK = 16  # weights per scale byte
SUB_SCALE_LIMIT = 127  # iq4h's sub-scales are int8
NO_POWER = 1 << 10  # a zero scale's power: above any other, so it never sets a superblock's 2^k0


def zero_blocks(blocks: np.ndarray) -> np.ndarray:
    """MXFP4 blocks ``[..., 17]`` -> whether each one's codes all name zero (0 and 8: both nibbles of every byte)
    ``[...]``."""
    return ((blocks[..., 1:] & 0x77) == 0).all(axis=-1)


def mxfp4_fits(raw: np.ndarray, rows: int, width: int) -> bool:
    """Whether every block of a raw MXFP4 tensor that holds a nonzero value has a scale 2^(e − 128) that q4t's float16
    d holds (e in ``MXFP4_EXPONENTS``); such a tensor is kept as stored, another read as floats."""
    low, high = MXFP4_EXPONENTS
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, MXFP4_BLOCK_BYTES)
    outside = (blocks[:, 0] < low) | (blocks[:, 0] > high)
    return bool(zero_blocks(blocks[outside]).all())  # the blocks outside the range hold only zeros


def decode_mxfp4(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw MXFP4 bytes -> q4t with ``kvalues_mxfp4`` and d = 2^(e − 128) as float32, 0 in the blocks whose codes all
    name zero. The part packs d as float16, so it takes only tensors within ``mxfp4_fits`` (another is refused there:
    "q4t scales must be float16 values")."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // LEGACY_WEIGHTS, MXFP4_BLOCK_BYTES)
    codes, exponents, zero = nibbles_of(blocks[..., 1:]), blocks[..., 0], zero_blocks(blocks)
    scales = np.ldexp(np.float32(1), exponents.astype(np.int32) - 128)  # [rows, B] float32
    d = np.where(zero, np.float32(0), scales)
    return "q4t", (torch.from_numpy(codes.reshape(rows, width)), E2M1_TABLE.expand(rows, 16), torch.from_numpy(d))


@cache
def ue4m3_parts() -> tuple[np.ndarray, np.ndarray]:
    """Each scale byte's s = c · 2^k (the module docstring) as (c [256] int64, odd or 0; k [256] int64, NO_POWER
    where c is 0)."""
    low_bits = np.arange(256) & 0x7F
    exponent, mantissa = low_bits >> 3, low_bits & 7
    c = np.where(exponent == 0, mantissa, 8 + mantissa)
    k = np.maximum(exponent, 1) - 11
    c[0x7F] = 0  # E4M3's NaN reads as 0; 0xFF, its sign bit ignored, as 240 (gguf-py's ue4m3_to_fp32)
    for _ in range(3):  # odd c (a c below 16 has at most 3 factors of 2): the smallest power each scale can share
        even = (c > 0) & (c % 2 == 0)
        c, k = np.where(even, c // 2, c), np.where(even, k + 1, k)
    return c, np.where(c == 0, NO_POWER, k)


def nvfp4_scales(raw: np.ndarray, rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw NVFP4 bytes -> (sub_scale ``[rows, width/16]`` int64 = c · 2^(k − k0), the power k0 of each superblock of
    256 weights ``[rows, ceil(width/256)]``; 0 where its scales are all 0)."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // NVFP4_WEIGHTS, NVFP4_BLOCK_BYTES)
    odd, power = ue4m3_parts()
    scale_bytes = blocks[..., :4].reshape(rows, -1)  # [rows, width/16]
    c, k = odd[scale_bytes], power[scale_bytes]
    per_super = Q4_K_WEIGHTS // NVFP4_SUB_BLOCK
    supers = -(-k.shape[1] // per_super)
    padded = np.pad(k, ((0, 0), (0, supers * per_super - k.shape[1])), constant_values=NO_POWER)
    k0 = padded.reshape(rows, supers, per_super).min(axis=-1)  # [rows, S]
    k0 = np.where(k0 == NO_POWER, 0, k0)
    shift = np.where(c == 0, 0, k - np.repeat(k0, per_super, axis=1)[:, : k.shape[1]])
    return c << np.minimum(shift, 32), k0  # a shift past 32 already overflows the int8 limit


def nvfp4_fits(raw: np.ndarray, rows: int, width: int) -> bool:
    """Whether every superblock of a raw NVFP4 tensor's scales is iq4h's d · sub_scale with sub-scales up to 127."""
    return int(nvfp4_scales(raw, rows, width)[0].max(initial=0)) <= SUB_SCALE_LIMIT


def decode_nvfp4(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw NVFP4 bytes (every superblock within ``nvfp4_fits``) -> ("iq4h", (codes [rows, width] uint8 in [0, 15],
    the e2m1 table, sub_scale [rows, width/16] int8 in [0, 127], d = 2^k0 [rows, ceil(width/256)] float32)). Raises
    ValueError for a tensor beyond ``nvfp4_fits`` (its sub-scales would not be int8)."""
    sub_scale, k0 = nvfp4_scales(raw, rows, width)
    if int(sub_scale.max(initial=0)) > SUB_SCALE_LIMIT:
        raise ValueError("an NVFP4 superblock's scales share no power of two within int8 sub-scales: read it as floats")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // NVFP4_WEIGHTS, NVFP4_BLOCK_BYTES)
    quants = blocks[..., 4:].reshape(rows, -1, 4, 8)  # [rows, B, 4 sub-blocks, 8 bytes]
    codes = np.concatenate([quants & 0x0F, quants >> 4], axis=-1).reshape(rows, width)
    d = np.ldexp(np.float32(1), k0.astype(np.int32)).astype(np.float32)
    table = E2M1_TABLE.expand(rows, 16)
    return "iq4h", (torch.from_numpy(codes), table, torch.from_numpy(sub_scale.astype(np.int8)), torch.from_numpy(d))

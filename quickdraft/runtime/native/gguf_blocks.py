"""A GGUF file's K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), ternary (TQ1_0, TQ2_0) and 32-weight (Q8_0, Q5_0, Q4_0,
Q5_1, Q4_1, IQ4_NL) tensors as the native runtime's q2, q4, q5, q6, q8, q8m, q4t and q4tm parts, bit for bit
(no second quantization). The i-quants' own structures are read in ``gguf_iquants.py``; ``gguf_exact.py`` picks the
tensors a model keeps.

Q4_K (llama.cpp's ``block_q4_K``, 144 bytes per 256 weights): float16 ``d`` and ``dmin``, 12 bytes packing eight
6-bit sub-scales and eight 6-bit sub-mins, and 128 bytes of 4-bit codes; weight = d · sub_scale · code − dmin ·
sub_min. That is exactly the q4 format of ``kquants.py`` with its ``dmin`` negated.

Q5_K (``block_q5_K``, 176 bytes): Q4_K's fields with 32 bytes of the codes' fifth bits between the sub-scales and
the nibbles (bit m of byte l: weight 32·m + l of the superblock); weight = d · sub_scale · code − dmin · sub_min
with codes in [0, 31]: the q5 format with ``dmin`` negated.

Q6_K (``block_q6_K``, 210 bytes per 256 weights): 128 bytes of the codes' low 4 bits, 64 bytes of their top 2
bits, sixteen int8 sub-scales and a float16 ``d``; weight = d · sub_scale · (code − 32): exactly the q6 format.

Q8_0 (``block_q8_0``, 34 bytes per 32 weights): a float16 ``d`` and 32 int8 codes; weight = d · q: the q8 format.
Q4_0 (18 bytes) and Q5_0 (22 bytes) are the same with codes of 4 and 5 bits and an offset: weight = d · (code − 8)
and d · (code − 16), where a byte of nibbles holds weight l (low) and l + 16 (high) and Q5_0's 32-bit ``qh`` the
fifth bit of weight l at bit l. So Q5_0's codes minus 16 are q8 codes in [−16, 15], and Q4_0's codes index the
q4t table −8..7. IQ4_NL (18 bytes) is Q4_0's block with codes indexing ``kvalues_iq4nl``: q4t with that table.
Q4_1 (20 bytes) and Q5_1 (24 bytes) hold a float16 min ``m`` after ``d`` and no offset: weight = d · code + m, the
q4tm (table 0..15) and q8m formats.

Q3_K (``block_q3_K``, 110 bytes per 256 weights): 32 bytes ``hmask``, 64 bytes ``qs``, 12 bytes packing sixteen
6-bit sub-scales and a float16 ``d``. Weight 128·h + 32·j + l (h < 2, j < 4, l < 32) has the 2-bit code at bits
2j of qs byte 32·h + l and its third bit at bit 4h + j of hmask byte l; its value is that code, minus 4 where the
third bit is clear, in [−4, 3]. Sub-scale s (of 16 weights) has its low 4 bits in the low (s < 8) or high nibble of
byte s mod 8 and its top 2 bits at bits 2·(s / 4) of byte 8 + s mod 4, and holds sub_scale + 32; weight = d ·
sub_scale · value. That is the q6 format with codes value + 32 in [28, 35] and sub-scales in [−32, 31].

Q2_K (``block_q2_K``, 84 bytes per 256 weights): sixteen bytes each holding a sub-block's 4-bit sub-scale (low
nibble) and 4-bit sub-min (high nibble), 64 bytes ``qs``, a float16 ``d`` and a float16 ``dmin``. Weight 128·h +
32·j + l (h < 2, j < 4, l < 32) has its 2-bit code at bits 2j of qs byte 32·h + l; weight = d · sub_scale · code −
dmin · sub_min, sub-block (of 16) by sub-block: the q2 format, with dmin negated.

The ternary types hold trits t in {0, 1, 2} and a float16 ``d`` per 256 weights, weight = d · (t − 1): the q2 format
with codes t, sub-scales and sub-mins 1, and dmin = −d. TQ2_0 (``block_tq2_0``, 66 bytes): 64 bytes of 2-bit trits
(weight 128·h + 32·j + l at bits 2j of byte 32·h + l, as Q2_K's), then ``d``. TQ1_0 (``block_tq1_0``, 54 bytes):
48 bytes of five trits each and 4 bytes of four, packed in base 3 as fixed-point fractions (trit p of byte b is
(b · 3^p mod 256) · 3 / 256, rounded down), then ``d``.
"""

from __future__ import annotations

import numpy as np
import torch

from quickdraft.runtime.native.kquants import Q6_OFFSET
from quickdraft.runtime.native.parts import row_chunks
from quickdraft.runtime.native.q4tables import IQ4_NL_TABLE, Q4_0_TABLE, Q4_1_TABLE

Q4_K_BLOCK_BYTES = 144
Q4_K_WEIGHTS = 256
Q5_K_BLOCK_BYTES = 176
Q5_K_FIFTH_BITS = slice(16, 48)  # the bytes of a Q5_K block that Q4_K's lacks
LEGACY_WEIGHTS = 32  # weights per Q8_0, Q5_0, Q4_0, Q5_1, Q4_1, IQ4_NL or MXFP4 block
Q6_K_BLOCK_BYTES = 210
Q2_K_BLOCK_BYTES = 84
Q3_K_BLOCK_BYTES = 110
Q3_K_SCALE_OFFSET = 32  # Q3_K's 6-bit sub-scales hold sub_scale + 32
TQ1_0_BLOCK_BYTES = 54
TQ2_0_BLOCK_BYTES = 66

# GGUF tensor names of a Llama-family layer -> transformers names (``model.layers.{i}.`` + this)
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# ... of a layer whose q/k/v and gate/up are one tensor each (``DecoderConfig.fused_projections``: Phi-3)
FUSED_LAYER_TENSORS = LAYER_TENSORS | {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}

# codes, sub_scale, sub_min, d, dmin
Blocks = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
# A weight kept as stored: (its part kind, the arguments of that part's ``from_blocks``)
ExactWeight = tuple[str, tuple[torch.Tensor, ...]]


def float16_at(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of each block ``[.., block_bytes]`` as float32 ``[..]`` (every float16 is exact)."""
    return blocks[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def transformers_name(gguf_name: str, fused: bool = False) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``, ``output.weight`` -> ``lm_head.weight``
    (None for names without a transformers linear weight); ``fused``: the names of a model with fused projections
    (``blk.3.ffn_up.weight`` -> ``model.layers.3.mlp.gate_up_proj.weight``)."""
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    names = FUSED_LAYER_TENSORS if fused else LAYER_TENSORS
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.weight"
    return None


def decode_q4_k(raw: np.ndarray, rows: int, width: int) -> Blocks:
    """Raw Q4_K bytes of a ``[rows, width]`` tensor -> (codes [rows, width] uint8 in [0, 15], sub_scale and
    sub_min [rows, width/32] uint8 in [0, 63], d and dmin [rows, width/256] float32), where
    weight = d · sub_scale · code − dmin · sub_min."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // Q4_K_WEIGHTS, Q4_K_BLOCK_BYTES)
    d, dmin = float16_at(blocks, 0), float16_at(blocks, 2)  # [rows, S]
    packed = blocks[..., 4:16].astype(np.uint8)  # [rows, S, 12]
    low, high, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sub_scale = np.concatenate([low & 63, (top & 0x0F) | ((low >> 6) << 4)], axis=-1)  # [rows, S, 8]
    sub_min = np.concatenate([high & 63, (top >> 4) | ((high >> 6) << 4)], axis=-1)
    quants = blocks[..., 16:].reshape(rows, width // Q4_K_WEIGHTS, 4, 1, 32)  # 4 chunks of 64 weights
    nibble_shift = np.array([0, 4], np.uint8).reshape(2, 1)  # [nibble, 1]
    codes = np.empty((rows, width // Q4_K_WEIGHTS, 4, 2, 32), np.uint8)  # sub-blocks 2c and 2c + 1 of chunk c
    for chunk in row_chunks(rows):  # a few MB at a time: the temporaries stay in the cache
        codes[chunk] = (quants[chunk] >> nibble_shift) & 0x0F
    return (
        torch.from_numpy(codes.reshape(rows, width)),
        torch.from_numpy(sub_scale.reshape(rows, -1)),
        torch.from_numpy(sub_min.reshape(rows, -1)),
        torch.from_numpy(d),
        torch.from_numpy(dmin),
    )


def q4_weight(blocks: Blocks) -> ExactWeight:
    """Decoded Q4_K blocks as a q4 part's fields (Q4_K subtracts dmin·m; q4 parts add it)."""
    codes, sub_scale, sub_min, d, dmin = blocks
    return "q4", (codes, sub_scale, sub_min, d, -dmin)


def decode_q5_k(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q5_K bytes of a ``[rows, width]`` tensor -> ("q5", (codes [rows, width] uint8 in [0, 31], sub_scale,
    sub_min, d, dmin as :func:`q4_weight` gives them)). The block without its fifth bits is a Q4_K block."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // Q4_K_WEIGHTS, Q5_K_BLOCK_BYTES)
    as_q4_k = np.concatenate([blocks[..., : Q5_K_FIFTH_BITS.start], blocks[..., Q5_K_FIFTH_BITS.stop :]], axis=-1)
    _, (nibbles, *scales) = q4_weight(decode_q4_k(as_q4_k, rows, width))
    planes = blocks[..., Q5_K_FIFTH_BITS][:, :, None, :]  # [rows, S, 1, 32]: byte l
    fifth = (planes >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1  # [rows, S, m, l]: weight 32·m + l
    codes = nibbles | torch.from_numpy(fifth.reshape(rows, width) << 4)
    return "q5", (codes, *scales)


def decode_q6_k(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q6_K bytes of a ``[rows, width]`` tensor -> ("q6", (codes [rows, width] uint8 in [0, 63], sub_scale
    [rows, width/16] int8, d [rows, width/256] float32)), where weight = d · sub_scale · (code − 32)."""
    supers = width // Q4_K_WEIGHTS
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, supers, Q6_K_BLOCK_BYTES)
    low = blocks[..., :128].reshape(rows, supers, 2, 1, 2, 32)  # [.., half, 1, part, l]: byte l + 32·part of a half
    top = blocks[..., 128:192].reshape(rows, supers, 2, 1, 1, 32)  # [.., half, 1, 1, l]
    # weight 128·half + 32·m + l (m = 2·nibble + part): low nibble of part m % 2 (m < 2) or high nibble (m >= 2); top
    # bits 2m of qh[l]
    nibble_shift = np.array([0, 4], np.uint8).reshape(2, 1, 1)  # [nibble, 1, 1]
    top_shift = (2 * np.arange(4, dtype=np.uint8)).reshape(2, 2, 1)  # [nibble, part, 1]: bits 2m
    codes = np.empty((rows, supers, 2, 2, 2, 32), np.uint8)  # [.., half, nibble, part, l]
    for chunk in row_chunks(rows):  # a few MB at a time: the temporaries stay in the cache
        nibbles = (low[chunk] >> nibble_shift) & 0x0F
        codes[chunk] = nibbles | (((top[chunk] >> top_shift) & 3) << 4)
    codes = codes.reshape(rows, width)
    sub_scale = blocks[..., 192:208].copy().view(np.int8).reshape(rows, width // 16)
    d = float16_at(blocks, 208)  # [rows, S]
    return "q6", (torch.from_numpy(codes), torch.from_numpy(sub_scale), torch.from_numpy(d))


def two_bit_codes(quants: np.ndarray) -> np.ndarray:
    """Q2_K's and TQ2_0's 64 code bytes per block ``[rows, S, 64]`` -> codes ``[rows, S, 256]`` in weight order:
    weight 128·h + 32·j + l at bits 2j of byte 32·h + l."""
    codes = (quants.reshape(*quants.shape[:2], 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(4, 1)) & 3
    return codes.reshape(*quants.shape[:2], Q4_K_WEIGHTS)  # from [rows, S, h, j, l]


def decode_q2_k(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q2_K bytes of a ``[rows, width]`` tensor -> ("q2", (codes [rows, width] uint8 in [0, 3], sub_scale and
    sub_min [rows, width/16] uint8 in [0, 15], d and −dmin [rows, width/256] float32))."""
    supers = width // Q4_K_WEIGHTS
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, supers, Q2_K_BLOCK_BYTES)
    scales = blocks[..., :16].reshape(rows, width // 16)
    return "q2", (
        torch.from_numpy(two_bit_codes(blocks[..., 16:80]).reshape(rows, width)),
        torch.from_numpy(scales & 0x0F),
        torch.from_numpy(scales >> 4),
        torch.from_numpy(float16_at(blocks, 80)),
        torch.from_numpy(-float16_at(blocks, 82)),
    )


def ternary_q2(trits: np.ndarray, d: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Trits ``[rows, S, 256]`` in weight order and ``d [rows, S]`` -> ("q2", (codes, sub_scale 1, sub_min 1, d,
    −d))."""
    ones = torch.ones(rows, width // 16, dtype=torch.uint8)
    return "q2", (
        torch.from_numpy(trits.reshape(rows, width)),
        ones,
        ones.clone(),
        torch.from_numpy(d),
        torch.from_numpy(-d),
    )


def decode_tq2_0(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw TQ2_0 bytes -> q2 fields (:func:`ternary_q2`)."""
    supers = width // Q4_K_WEIGHTS
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, supers, TQ2_0_BLOCK_BYTES)
    return ternary_q2(two_bit_codes(blocks[..., :64]), float16_at(blocks, 64), rows, width)


def decode_tq1_0(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw TQ1_0 bytes -> q2 fields (:func:`ternary_q2`): weights 0..159 from the first 32 bytes (trit p of byte l:
    weight 32·p + l), 160..239 from the next 16, 240..255 from the 4 bytes of four."""
    supers = width // Q4_K_WEIGHTS
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, supers, TQ1_0_BLOCK_BYTES)
    powers = np.array([1, 3, 9, 27, 81], dtype=np.uint8).reshape(5, 1)

    def trits_of(packed: np.ndarray, count: int) -> np.ndarray:  # [rows, S, n] -> [rows, S, count · n]
        shifted = packed[..., None, :] * powers[:count]  # uint8: mod 256
        return ((shifted.astype(np.uint16) * 3) >> 8).astype(np.uint8).reshape(rows, supers, -1)

    parts = (trits_of(blocks[..., :32], 5), trits_of(blocks[..., 32:48], 5), trits_of(blocks[..., 48:52], 4))
    return ternary_q2(np.concatenate(parts, axis=-1), float16_at(blocks, 52), rows, width)


def decode_q3_k(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q3_K bytes of a ``[rows, width]`` tensor -> ("q6", (codes [rows, width] uint8 in [28, 35], sub_scale
    [rows, width/16] int8 in [−32, 31], d [rows, width/256] float32)): the values as q6 codes (value + 32)."""
    supers = width // Q4_K_WEIGHTS
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, supers, Q3_K_BLOCK_BYTES)
    third_bits = blocks[..., None, None, 0:32]  # [rows, S, 1, 1, l]
    low_bits = blocks[..., 32:96].reshape(rows, supers, 2, 1, 32)  # [rows, S, h, 1, l]
    j = np.arange(4, dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    h = np.arange(2, dtype=np.uint8).reshape(1, 1, 2, 1, 1)
    codes = ((low_bits >> (2 * j)) & 3) | (((third_bits >> (4 * h + j)) & 1) << 2)  # [rows, S, h, j, l] in [0, 7]
    packed = blocks[..., 96:108]  # [rows, S, 12]
    low = np.concatenate([packed[..., 0:8] & 0x0F, packed[..., 0:8] >> 4], axis=-1)  # [rows, S, 16]
    top = (packed[..., None, 8:12] >> (2 * np.arange(4, dtype=np.uint8)).reshape(4, 1)) & 3  # [rows, S, s/4, s%4]
    scales = low.astype(np.int16) | (top.reshape(rows, supers, 16).astype(np.int16) << 4)
    return "q6", (
        torch.from_numpy((codes + (Q6_OFFSET - 4)).reshape(rows, width)),
        torch.from_numpy((scales - Q3_K_SCALE_OFFSET).astype(np.int8).reshape(rows, -1)),
        torch.from_numpy(float16_at(blocks, 108)),
    )


def legacy_blocks(raw: np.ndarray, rows: int, width: int, block_bytes: int) -> tuple[np.ndarray, torch.Tensor]:
    """A tensor of 32-weight blocks (Q8_0, Q5_0, Q4_0, Q5_1, Q4_1, IQ4_NL) as ``[rows, width/32, block_bytes]``, and
    its scales ``d [rows, width/32]`` (float16 values as float32; every such block starts with its float16 ``d``)."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, width // LEGACY_WEIGHTS, block_bytes)
    return blocks, torch.from_numpy(float16_at(blocks, 0))


def nibbles_of(quants: np.ndarray) -> np.ndarray:
    """16 bytes of nibbles per block ``[.., 16]`` -> codes ``[.., 32]``: weight l the low nibble of byte l, weight
    l + 16 its high nibble."""
    return np.concatenate([quants & 0x0F, quants >> 4], axis=-1)


def decode_q8_0(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q8_0 bytes -> ("q8", (codes [rows, width] int8, d [rows, width/32]))."""
    blocks, d = legacy_blocks(raw, rows, width, 34)
    return "q8", (torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(rows, width)), d)


def table_codes(raw: np.ndarray, rows: int, width: int, table: torch.Tensor) -> ExactWeight:
    """Raw bytes of Q4_0's block structure (a float16 d, 16 bytes of nibbles) whose codes index ``table`` ->
    ("q4t", (codes [rows, width] uint8 in [0, 15], table [rows, 16], d))."""
    blocks, d = legacy_blocks(raw, rows, width, 18)
    codes = nibbles_of(blocks[..., 2:])
    return "q4t", (torch.from_numpy(codes.reshape(rows, width)), table.expand(rows, 16), d)


def decode_q4_0(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q4_0 bytes -> q4t with the table −8..7 (weight = d · (code − 8))."""
    return table_codes(raw, rows, width, Q4_0_TABLE)


def decode_iq4_nl(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw IQ4_NL bytes -> q4t with llama.cpp's ``kvalues_iq4nl`` (weight = d · value[code])."""
    return table_codes(raw, rows, width, IQ4_NL_TABLE)


def five_bit_codes(blocks: np.ndarray, at: int, offset: int = 0) -> np.ndarray:
    """Q5_0/Q5_1 blocks ``[rows, B, bytes]`` whose 32-bit ``qh`` is at byte ``at``, their nibbles after it -> the
    codes minus ``offset`` ``[rows, B, 32]`` int8, CODE_ROWS rows at a time (the temporaries stay in the cache)."""
    codes = np.empty((*blocks.shape[:2], LEGACY_WEIGHTS), np.uint8)
    for chunk in row_chunks(len(blocks)):
        fifth = np.unpackbits(blocks[chunk, :, at : at + 4], axis=-1, bitorder="little")  # little-endian: bit l
        codes[chunk] = (nibbles_of(blocks[chunk, :, at + 4 :]) | (fifth << 4)) - np.uint8(offset)  # wraps below 0
    return codes.view(np.int8)


def decode_q5_0(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q5_0 bytes -> ("q8", (codes − 16 [rows, width] int8 in [−16, 15], d))."""
    blocks, d = legacy_blocks(raw, rows, width, 22)
    return "q8", (torch.from_numpy(five_bit_codes(blocks, 2, offset=16).reshape(rows, width)), d)


def minimums(blocks: np.ndarray) -> torch.Tensor:
    """A Q4_1/Q5_1 tensor's float16 mins (bytes 2-3 of each block) as float32 ``[rows, B]``."""
    return torch.from_numpy(float16_at(blocks, 2))


def decode_q4_1(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q4_1 bytes -> ("q4tm", (codes [rows, width] uint8 in [0, 15], the table 0..15 [rows, 16], d, mins))."""
    blocks, d = legacy_blocks(raw, rows, width, 20)
    codes = nibbles_of(blocks[..., 4:])
    return "q4tm", (torch.from_numpy(codes.reshape(rows, width)), Q4_1_TABLE.expand(rows, 16), d, minimums(blocks))


def decode_q5_1(raw: np.ndarray, rows: int, width: int) -> ExactWeight:
    """Raw Q5_1 bytes -> ("q8m", (codes [rows, width] int8 in [0, 31], d, mins))."""
    blocks, d = legacy_blocks(raw, rows, width, 24)
    return "q8m", (torch.from_numpy(five_bit_codes(blocks, 4).reshape(rows, width)), d, minimums(blocks))

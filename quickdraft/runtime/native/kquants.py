"""Weight parts in llama.cpp's K-quant structures (``gemm.h``, ``gemm_q6.h``), and every part format by name:

- ``q4``: llama.cpp's Q4_K structure: 4-bit codes in groups of 32, each group with an 8-bit sub-scale and
  sub-min under float superblock scales (d, dmin) per 8 groups: w = d · sub_scale · code + dmin · sub_min.
- ``q5``: llama.cpp's Q5_K structure: q4's with 5-bit codes, their fifth bits in a plane of their own.
- ``q6``: llama.cpp's Q6_K structure: 6-bit codes in sub-blocks of 16, each with a signed 8-bit sub-scale, under
  a float d per superblock of 256: w = d · sub_scale · (code − 32).

A GGUF file's Q4_K, Q5_K and Q6_K tensors load into these parts exactly, with no second quantization
(``gguf_blocks.py``). Every format is named in ``formats.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from quickdraft.runtime.native.float_ops import fused_multiply_add
from quickdraft.runtime.native.parts import (
    GROUP,
    LANES,
    Affine,
    BlockPart,
    packed_by_chunks,
    pad_rows,
    padded,
    row_chunks,
)

GROUPS_PER_SUPER = 8  # q4, q5 and q6: groups per superblock
SUB_BLOCK = 16  # q6: weights per sub-scale
Q6_OFFSET = 32  # q6 codes hold w / (d · sub_scale) + 32


def lanes_last(values: torch.Tensor) -> torch.Tensor:
    """Per-row values ``[N, X]`` -> ``[N/16, X, 16]`` (zero rows up to a whole panel): a vector of 16 outputs'."""
    rows = values.shape[0]
    return pad_rows(values, padded(rows)).reshape(padded(rows) // LANES, LANES, -1).permute(0, 2, 1)


def rows_first(values: torch.Tensor, rows: int) -> torch.Tensor:
    """:func:`lanes_last`'s inverse: ``[N/16, X, 16]`` -> ``[rows, X]``."""
    return values.permute(0, 2, 1).reshape(values.shape[0] * LANES, -1)[:rows]


def lane_pairs(values: torch.Tensor) -> torch.Tensor:
    """Per-row values ``[N, 2P]`` -> ``[N/16, P, 16, 2]``: pair p of 16 outputs side by side, for one int16 pair
    multiply-add (q4's sub-mins, q6's sub-scales)."""
    rows = values.shape[0]
    return pad_rows(values, padded(rows)).reshape(padded(rows) // LANES, LANES, -1, 2).transpose(1, 2)


def rows_from_pairs(values: torch.Tensor, rows: int) -> torch.Tensor:
    """:func:`lane_pairs`' inverse: ``[N/16, P, 16, 2]`` -> ``[rows, 2P]``."""
    return values.transpose(1, 2).reshape(values.shape[0] * LANES, -1)[:rows]


def code_panels(codes: torch.Tensor, rows: slice) -> torch.Tensor:
    """Plain codes ``[N, K]``' ``rows`` as ``[n/16, 16, K/32, 8, 4]`` uint8 (lane, group, code vector, byte), zero
    rows appended up to a whole panel."""
    chunk = codes[rows].to(torch.uint8)
    return pad_rows(chunk, padded(len(chunk))).reshape(-1, LANES, codes.shape[1] // GROUP, 8, 4)


def superblock_reference(
    rows: torch.Tensor,
    codes: torch.Tensor,
    sub_scale: torch.Tensor,
    sub_min: torch.Tensor,
    d: torch.Tensor,
    dmin: torch.Tensor,
    block: int,
    per_super: int,
) -> torch.Tensor:
    """The float sequence of the formats with a sub-scale and a sub-min per block of ``block`` weights under d and dmin
    per ``per_super`` blocks (``gemm.h``'s q4 and q5, ``gemm_q2.h``'s q2) in PyTorch operations: integer-valued float
    ``rows [M, K]``, ``codes [N, K]``, ``sub_scale``/``sub_min [N, K/block]``, ``d``/``dmin [N, S]`` -> ``[M, N]``: per
    superblock in order, fma(d, Σ sub_scale · Σ code·x), then fma(dmin, Σ sub_min · Σ x), each sum an exact integer."""
    blocks = rows.shape[1] // block
    x = rows.double().reshape(rows.shape[0], blocks, block)  # [M, B, block]
    dots = torch.einsum("mbk,nbk->mnb", x, codes.double().reshape(len(codes), blocks, block))  # exact
    sums = x.sum(-1)  # [M, B] exact
    acc = torch.zeros(rows.shape[0], len(codes))
    for first in range(0, blocks, per_super):
        s, span = first // per_super, range(first, min(first + per_super, blocks))
        total = sum(dots[:, :, b] * sub_scale[:, b].double() for b in span)  # integers: exact
        acc = fused_multiply_add(d[:, s], total.float(), acc)
        offset = sum(sums[:, b, None] * sub_min[:, b].double() for b in span)  # integers: exact
        acc = fused_multiply_add(dmin[:, s], offset.float(), acc)
    return acc


def superblock_affine(
    codes: torch.Tensor,
    sub_scale: torch.Tensor,
    sub_min: torch.Tensor,
    d: torch.Tensor,
    dmin: torch.Tensor,
    block: int,
    per_super: int,
) -> Affine:
    """:func:`superblock_reference`'s fields as values, scales (d · sub_scale), offsets (dmin · sub_min) per block."""
    rows, blocks = sub_scale.shape
    index = torch.arange(blocks) // per_super
    scale = d[:, index].float() * sub_scale.float()  # [rows, B]
    offset = dmin[:, index].float() * sub_min.float()
    return Affine(codes.to(torch.int8).reshape(rows, blocks, block), scale, offset)


def pack_bit_pairs(values: torch.Tensor) -> torch.Tensor:
    """2-bit values ``[N/16, 16, G, 8, 4]`` (lane, group, code vector j, byte i) -> bytes ``[N/16, G, 2, 16, 4]``,
    byte (h, lane, i) holding vector 4h + c at bits 2c (q6's top bits, q2's codes)."""
    quads = values.reshape(*values.shape[:3], 2, 4, 4)  # [.., h, c, i]
    packed = quads[..., 0, :] | (quads[..., 1, :] << 2) | (quads[..., 2, :] << 4) | (quads[..., 3, :] << 6)
    return packed.permute(0, 2, 3, 1, 4)


def unpack_bit_pairs(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_bit_pairs`' inverse: ``[N/16, G, 2, 16, 4]`` -> ``[N/16, 16, G, 8, 4]``."""
    planes = packed.permute(0, 3, 1, 2, 4)  # [N/16, 16, G, 2, 4]
    values = torch.stack([(planes >> (2 * c)) & 3 for c in range(4)], dim=4)  # [.., h, c, i]
    return values.reshape(*planes.shape[:3], 8, 4)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[N/16, 16, G, 8, 4]`` (lane, group, code vector j, byte i) -> bytes ``[N/16, G, 4, 16, 4]``
    holding vector j in the low nibble and vector j + 4 in the high one (``gemm.h``'s q4 codes)."""
    return (codes[:, :, :, :4] | (codes[:, :, :, 4:] << 4)).permute(0, 2, 3, 1, 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_nibbles`' inverse: ``[N/16, G, 4, 16, 4]`` -> ``[N/16, 16, G, 8, 4]``."""
    packed = packed.permute(0, 3, 1, 2, 4)  # [N/16, 16, G, 4, 4]
    return torch.cat([packed & 0x0F, packed >> 4], dim=3)


class Q4Part(BlockPart):
    """4-bit codes in Q4_K's structure (see the module docstring); packed as ``gemm.h`` describes."""

    kind = "q4"
    kernel_kind = 1
    tensor_names = ("codes", "sub_scale", "sub_min", "d", "dmin")
    max_code: ClassVar[int] = 15

    def __init__(self, rows: int, **tensors: torch.Tensor) -> None:
        self.rows = rows
        for name in self.tensor_names:
            value = tensors[name].float() if name in ("d", "dmin") else tensors[name]
            setattr(self, name, value.contiguous())
        self.in_features = self.codes.shape[1] * GROUP

    @classmethod
    def from_blocks(
        cls,
        codes: torch.Tensor,
        sub_scale: torch.Tensor,
        sub_min: torch.Tensor,
        d: torch.Tensor,
        dmin: torch.Tensor,
    ) -> Q4Part:
        """Plain ``codes [N, K]`` in [0, max_code], ``sub_scale``/``sub_min [N, K/32]`` in [0, 255] and float
        ``d``/``dmin [N, K/256]`` (w = d · sub_scale · code + dmin · sub_min) -> the packed part. K must be a
        multiple of 64."""
        rows, width = codes.shape
        if width % (2 * GROUP):
            raise ValueError(f"{cls.kind} weights need a multiple of {2 * GROUP} input features, got {width}")
        if codes.numel() and int(codes.max()) > cls.max_code:
            raise ValueError(f"{cls.kind} codes are at most {cls.max_code}, got {int(codes.max())}")

        def pack(chunk: slice) -> dict[str, torch.Tensor]:
            panels = code_panels(codes, chunk)
            return {"codes": pack_nibbles(panels & 0x0F), **cls.packed_fifth_bits(panels)}  # [n/16, G, 4, 16, 4]

        return cls(
            rows,
            **packed_by_chunks(rows, pack),
            sub_scale=lanes_last(sub_scale.to(torch.uint8)),
            sub_min=lane_pairs(sub_min.to(torch.uint8)),
            d=lanes_last(d.float()),
            dmin=lanes_last(dmin.float()),
        )

    @classmethod
    def packed_fifth_bits(cls, codes: torch.Tensor) -> dict[str, torch.Tensor]:
        """The packed tensors besides the nibbles, from codes ``[N/16, 16, G, 8, 4]``: none for q4."""
        return {}

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q4Part:
        """Round-to-nearest quantization of float weights into the format's codes (for models that come without
        them; a GGUF file's own blocks are loaded exactly instead)."""
        groups = weight.float().reshape(weight.shape[0], -1, GROUP)  # [N, G, 32]
        low = groups.amin(dim=-1).clamp(max=0.0)  # like llama.cpp: the offset is never positive
        return cls.from_groups(weight, low, (groups.amax(dim=-1) - low).clamp_min(1e-30) / cls.max_code, cls.max_code)

    @classmethod
    def from_groups(cls, weight: torch.Tensor, low: torch.Tensor, step: torch.Tensor, levels: int = 15) -> Q4Part:
        """``weight [N, K]`` as w ≈ step · code + low per group of 32 (``low`` <= 0, ``step``: [N, G]), code in [0,
        levels] stored as the code · (max_code // levels): q4's ``levels`` 3 and 7 give 2- and 3-bit codes."""
        if not 1 <= levels <= cls.max_code:
            raise ValueError(f"{cls.kind} codes hold 1 to {cls.max_code} levels above zero, not {levels}")
        stretch = cls.max_code // levels  # the stored step is step / stretch
        rows, width = weight.shape
        groups = weight.float().reshape(rows, width // GROUP, GROUP)
        supers = -(-(width // GROUP) // GROUPS_PER_SUPER)
        index = torch.arange(width // GROUP) // GROUPS_PER_SUPER  # each group's superblock

        def split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [N, G] -> ([N, S], u8 [N, G])
            padded_values = torch.nn.functional.pad(values, (0, supers * GROUPS_PER_SUPER - values.shape[1]))
            top = padded_values.reshape(rows, supers, GROUPS_PER_SUPER).amax(-1).clamp_min(1e-30) / 255  # [N, S]
            return top, torch.round(values / top[:, index]).clamp_(0, 255).to(torch.uint8)

        d, sub_scale = split(step / stretch)
        dmin_magnitude, sub_min = split(-low)
        scale = (d[:, index] * sub_scale.float() * stretch).clamp_min(1e-30)[..., None]  # after rounding [N, G, 1]
        offset = (-dmin_magnitude[:, index] * sub_min.float())[..., None]
        codes = torch.empty(rows, width // GROUP, GROUP, dtype=torch.uint8)  # [N, G, 32]
        for rest in row_chunks(rows):  # a few MB at a time, in place: the operations stay in the cache
            codes[rest] = (groups[rest] - offset[rest]).div_(scale[rest]).round_().clamp_(0, levels).mul_(stretch)
        return cls.from_blocks(codes.reshape(rows, width), sub_scale, sub_min, d, -dmin_magnitude)

    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The plain ``(codes, sub_scale, sub_min, d, dmin)`` of :meth:`from_blocks`."""
        codes = self.unpacked_codes().reshape(self.padded_rows, self.in_features)[: self.rows]
        sub_min = rows_from_pairs(self.sub_min, self.rows)
        sub_scale, d, dmin = (rows_first(t, self.rows) for t in (self.sub_scale, self.d, self.dmin))
        return codes, sub_scale, sub_min, d, dmin

    def unpacked_codes(self) -> torch.Tensor:
        """The codes ``[N/16, 16, G, 8, 4]``."""
        return unpack_nibbles(self.codes)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q4_matmul(rows, self.codes, self.sub_scale, self.sub_min, self.d, self.dmin, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        return superblock_reference(rows, *self.blocks(), GROUP, GROUPS_PER_SUPER)

    @staticmethod
    def affine(
        codes: torch.Tensor, sub_scale: torch.Tensor, sub_min: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor
    ) -> Affine:
        return superblock_affine(codes, sub_scale, sub_min, d, dmin, GROUP, GROUPS_PER_SUPER)


class Q5Part(Q4Part):
    """5-bit codes in Q5_K's structure: q4's nibbles, sub-scales, sub-mins and superblock scales, and a plane of
    the codes' fifth bits, ``high [N/16, G, 16, 4]``: bit j of byte (lane, i) belongs to code vector j's byte
    (``gemm.h``'s q5), so the kernels add it to the nibbles they already unpack."""

    kind = "q5"
    kernel_kind = 3
    tensor_names = ("codes", "high", "sub_scale", "sub_min", "d", "dmin")
    max_code = 31

    @classmethod
    def packed_fifth_bits(cls, codes: torch.Tensor) -> dict[str, torch.Tensor]:
        fifth = (codes >> 4).to(torch.uint8)  # [N/16, 16, G, 8, 4]
        plane = sum(fifth[:, :, :, j] << j for j in range(8))  # [N/16, 16, G, 4]
        return {"high": plane.to(torch.uint8).permute(0, 2, 1, 3).contiguous()}  # [N/16, G, 16, 4]

    def unpacked_codes(self) -> torch.Tensor:
        plane = self.high.permute(0, 2, 1, 3)  # [N/16, 16, G, 4]
        fifth = torch.stack([(plane >> j) & 1 for j in range(8)], dim=3)  # [N/16, 16, G, 8, 4]
        return unpack_nibbles(self.codes) | (fifth << 4)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q5_matmul(rows, self.codes, self.high, self.sub_scale, self.sub_min, self.d, self.dmin, out, column)


class Q6Part(BlockPart):
    """6-bit codes in Q6_K's structure (see the module docstring); packed as ``gemm_q6.h`` describes."""

    kind = "q6"
    kernel_kind = 2
    tensor_names = ("codes", "high", "sub_scale", "d")

    def __init__(self, rows: int, **tensors: torch.Tensor) -> None:
        self.rows = rows
        self.codes, self.high, self.sub_scale = (tensors[name].contiguous() for name in self.tensor_names[:3])
        self.d = tensors["d"].float().contiguous()
        self.in_features = self.codes.shape[1] * GROUP

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, sub_scale: torch.Tensor, d: torch.Tensor) -> Q6Part:
        """Plain ``codes [N, K]`` in [0, 63], int8 ``sub_scale [N, K/16]`` and float ``d [N, ceil(K/256)]``
        (w = d · sub_scale · (code − 32)) -> the packed part. K must be a multiple of 32."""
        rows, width = codes.shape
        if width % GROUP:
            raise ValueError(f"q6 weights need a multiple of {GROUP} input features, got {width}")

        def pack(chunk: slice) -> dict[str, torch.Tensor]:
            panels = code_panels(codes, chunk)  # [n/16, 16, G, j, i]
            return {
                "codes": pack_nibbles(panels & 0x0F),  # [n/16, G, 4, 16, 4]
                "high": pack_bit_pairs(panels >> 4),  # [n/16, G, 2, 16, 4]
            }

        return cls(
            rows,
            **packed_by_chunks(rows, pack),
            sub_scale=lane_pairs(sub_scale.to(torch.int8)),  # [N/16, G, 16, 2]
            d=lanes_last(d.float()),  # [N/16, S, 16]
        )

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q6Part:
        """Round-to-nearest 6-bit quantization of float weights into the Q6_K structure (a GGUF file's own Q6_K
        blocks are loaded exactly instead)."""
        rows, width = weight.shape
        sub_blocks = weight.float().reshape(rows, width // SUB_BLOCK, SUB_BLOCK)
        step = sub_blocks.abs().amax(dim=-1) / (Q6_OFFSET - 1)  # [N, J]: |w| / step <= 31, the codes' reach
        supers = -(-width // (GROUP * GROUPS_PER_SUPER))
        padded_step = torch.nn.functional.pad(step, (0, supers * 16 - step.shape[1])).reshape(rows, supers, 16)
        d = padded_step.amax(-1).clamp_min(1e-30) / 127  # [N, S]
        index = torch.arange(step.shape[1]) // 16
        sub_scale = torch.ceil(step / d[:, index]).clamp_(0, 127)  # [N, J]: rounded up, so no code is clipped
        scale = (d[:, index] * sub_scale).clamp_min(1e-30)[..., None]  # [N, J, 1]
        codes = torch.round(sub_blocks / scale).clamp_(-Q6_OFFSET, Q6_OFFSET - 1) + Q6_OFFSET
        return cls.from_blocks(codes.to(torch.uint8).reshape(rows, width), sub_scale.to(torch.int8), d)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The plain ``(codes, sub_scale, d)`` of :meth:`from_blocks`."""
        low = unpack_nibbles(self.codes)  # [N/16, 16, G, 8, 4]
        codes = (low | (unpack_bit_pairs(self.high) << 4)).reshape(self.padded_rows, self.in_features)[: self.rows]
        return codes, rows_from_pairs(self.sub_scale, self.rows), rows_first(self.d, self.rows)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q6_matmul(rows, self.codes, self.high, self.sub_scale, self.d, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        codes, sub_scale, d = self.blocks()
        sub_blocks = self.in_features // SUB_BLOCK
        x = rows.double().reshape(rows.shape[0], sub_blocks, SUB_BLOCK)  # [M, J, 16]
        dots = torch.einsum("mjk,njk->mnj", x, codes.double().reshape(self.rows, sub_blocks, SUB_BLOCK))  # exact
        terms = (dots - Q6_OFFSET * x.sum(-1)[:, None, :]).float()  # [M, N, J] integers below 2^24: exact
        acc = torch.zeros(rows.shape[0], self.rows)
        for j in range(sub_blocks):
            scale = d[:, j // (2 * GROUPS_PER_SUPER)] * sub_scale[:, j].float()  # [N]
            acc = fused_multiply_add(scale, terms[:, :, j], acc)
        return acc

    @staticmethod
    def affine(codes: torch.Tensor, sub_scale: torch.Tensor, d: torch.Tensor) -> Affine:
        rows, sub_blocks = sub_scale.shape
        index = torch.arange(sub_blocks) // (2 * GROUPS_PER_SUPER)
        scale = d[:, index].float() * sub_scale.float()  # [rows, J]
        values = (codes.to(torch.int16) - Q6_OFFSET).to(torch.int8).reshape(rows, sub_blocks, SUB_BLOCK)
        return Affine(values, scale, None)

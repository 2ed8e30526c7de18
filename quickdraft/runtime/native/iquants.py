"""Weight parts in llama.cpp's i-quant structures (``gemm_iq4.h``):

- ``iq4``: llama.cpp's IQ4_XS structure: 4-bit indices into a table of 16 int8 values, in groups of 32, each group
  with a signed sub-scale, under a float d per superblock of 8 groups: w = d · sub_scale · table[code].

- ``iq4h``: iq4 with a sub-scale per 16 weights.

A GGUF file's IQ4_XS tensors load into iq4 exactly with ``IQ4_VALUES`` as the table, its IQ2_XXS and IQ1_S tensors
with ``IQ2_VALUES`` and ``IQ1_VALUES``, and its IQ2_XS, IQ2_S and IQ1_M tensors into iq4h (``gguf_iquants.py``), with
no second quantization.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from quickdraft.runtime.native.float_ops import fused_multiply_add
from quickdraft.runtime.native.kquants import GROUPS_PER_SUPER, lanes_last, pack_nibbles, rows_first, unpack_nibbles
from quickdraft.runtime.native.parts import GROUP, LANES, Affine, BlockPart, pad_rows, padded, table_key

IQ4_VALUES = torch.tensor(  # kvalues_iq4nl
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.int8
)
# The IQ2 types' signed grid magnitudes (their grids' bytes 0x08, 0x19, 0x2b); the other codes are never stored
IQ2_VALUES = torch.tensor([-43, -25, -8, 8, 25, 43] + [0] * 10, dtype=torch.int8)
# The IQ1 types' values times 8: 8·value ± 1 for a grid value in {−1, 0, 1} and δ = ±1/8
IQ1_VALUES = torch.tensor([-9, -7, -1, 1, 7, 9] + [0] * 10, dtype=torch.int8)
HALF_GROUP = GROUP // 2  # iq4h: weights per sub-scale


class IQ4Part(BlockPart):
    """4-bit indices into a table in IQ4_XS's structure (see the module docstring). Plain, each row has its table
    (``[N, 16]``, one for all the rows of a part, as q4t's); packed as q4's nibbles, ``table [N/16, 16]`` int8 (a
    panel's), ``sub_scale [N/16, G, 16]`` int8 and ``d [N/16, S, 16]`` float (``gemm_iq4.h``)."""

    kind = "iq4"
    kernel_kind = 6
    tensor_names = ("codes", "table", "sub_scale", "d")
    sub_block = GROUP  # weights per sub-scale

    def __init__(self, rows: int, **tensors: torch.Tensor) -> None:
        self.rows = rows
        self.codes, self.sub_scale = tensors["codes"].contiguous(), tensors["sub_scale"].contiguous()
        self.table = tensors["table"].to(torch.int8).contiguous()
        self.d = tensors["d"].float().contiguous()
        self.in_features = self.codes.shape[1] * GROUP

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, table: torch.Tensor, sub_scale: torch.Tensor, d: torch.Tensor) -> IQ4Part:
        """Plain ``codes [N, K]`` in [0, 15], each row's ``table [N, 16]`` of int8 values (the same for every row),
        ``sub_scale [N, K/32]`` (iq4h: ``[N, K/16]``) in [−128, 127] and float ``d [N, ceil(K/256)]``
        (w = d · sub_scale · table[code]) -> the packed part. K must be a multiple of 32."""
        rows, width = codes.shape
        if width % GROUP:
            raise ValueError(f"{cls.kind} weights need a multiple of {GROUP} input features, got {width}")
        if codes.numel() and not 0 <= int(codes.min()) <= int(codes.max()) <= 15:
            raise ValueError(f"{cls.kind} codes are in [0, 15]")
        if table.shape != (rows, 16) or not bool((table == table[:1]).all()):
            raise ValueError(f"{cls.kind} weights take one table of 16 values for all their rows")
        if table.numel() and not -128 <= int(table.min()) <= int(table.max()) <= 127:
            raise ValueError(f"{cls.kind} table values are int8")
        if sub_scale.shape != (rows, width // cls.sub_block):
            raise ValueError(f"{cls.kind} weights take a sub-scale per {cls.sub_block} weights")
        if sub_scale.numel() and not -128 <= int(sub_scale.min()) <= int(sub_scale.max()) <= 127:
            raise ValueError(f"{cls.kind} sub-scales are in [-128, 127]")
        codes = pad_rows(codes.to(torch.uint8), padded(rows)).reshape(-1, LANES, width // GROUP, 8, 4)
        return cls(
            rows,
            codes=pack_nibbles(codes),  # [N/16, G, 4, 16, 4]
            table=table[:1].to(torch.int8).expand(padded(rows) // LANES, 16),  # [N/16, 16]
            sub_scale=lanes_last(sub_scale.to(torch.int8)),  # [N/16, G, 16] (iq4h: [N/16, 2G, 16])
            d=lanes_last(d.float()),  # [N/16, S, 16]
        )

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> IQ4Part:
        """Nearest table values under round-to-nearest scales (a GGUF file's own IQ4_XS blocks are loaded exactly
        instead): as llama.cpp's, each group's scale takes the sign that maps its largest magnitude to −127, the
        table's far end, and is a sub-scale in [−31, 31] times its superblock's d."""
        rows, width = weight.shape
        if width % GROUP:
            raise ValueError(f"iq4 weights need a multiple of {GROUP} input features, got {width}")
        groups = weight.float().reshape(rows, width // GROUP, GROUP)  # [N, G, 32]
        extreme = groups.gather(-1, groups.abs().argmax(dim=-1, keepdim=True))[..., 0]  # [N, G]: signed
        step = -extreme / 127  # [N, G]
        supers = -(-step.shape[1] // GROUPS_PER_SUPER)
        padded_step = torch.nn.functional.pad(step.abs(), (0, supers * GROUPS_PER_SUPER - step.shape[1]))
        d = padded_step.reshape(rows, supers, GROUPS_PER_SUPER).amax(-1).clamp_min(1e-30) / 31  # [N, S]
        index = torch.arange(step.shape[1]) // GROUPS_PER_SUPER
        sub_scale = torch.round(step / d[:, index]).clamp_(-31, 31)  # [N, G]
        scale = d[:, index] * sub_scale
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)[..., None]  # [N, G, 1]
        values = IQ4_VALUES.float()
        codes = torch.bucketize(groups / safe, (values[1:] + values[:-1]) / 2)  # the nearest value's index
        table = IQ4_VALUES.expand(rows, 16)
        return cls.from_blocks(codes.to(torch.uint8).reshape(rows, width), table, sub_scale.to(torch.int8), d)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The plain ``(codes, table, sub_scale, d)`` of :meth:`from_blocks`."""
        codes = unpack_nibbles(self.codes).reshape(self.padded_rows, self.in_features)[: self.rows]
        table = self.table.repeat_interleave(LANES, dim=0)[: self.rows]  # [N, 16]
        return codes, table, rows_first(self.sub_scale, self.rows), rows_first(self.d, self.rows)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.iq4_matmul(rows, self.codes, self.table, self.sub_scale, self.d, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        codes, table, sub_scale, d = self.blocks()
        blocks, per_super = self.in_features // self.sub_block, GROUPS_PER_SUPER * GROUP // self.sub_block
        values = table.long().gather(1, codes.long()).double().reshape(self.rows, blocks, self.sub_block)  # [N, B, S]
        x = rows.double().reshape(rows.shape[0], blocks, self.sub_block)  # [M, B, S]
        dots = torch.einsum("mbk,nbk->mnb", x, values)  # [M, N, B] exact
        acc = torch.zeros(rows.shape[0], self.rows)
        for first in range(0, blocks, per_super):
            span = range(first, min(first + per_super, blocks))
            total = sum(dots[:, :, b] * sub_scale[:, b].double() for b in span)  # integers below 2^31: exact
            acc = fused_multiply_add(d[:, first // per_super], total.float(), acc)
        return acc

    @staticmethod
    def join_key(fields: tuple[torch.Tensor, ...]) -> Hashable:
        return table_key(fields[1])

    @staticmethod
    def affine(codes: torch.Tensor, table: torch.Tensor, sub_scale: torch.Tensor, d: torch.Tensor) -> Affine:
        return table_affine(codes, table, sub_scale, d, GROUP)


class IQ4HalfPart(IQ4Part):
    """iq4 with a sub-scale per 16 weights (llama.cpp's IQ2_XS, IQ2_S and IQ1_M scales): plain ``sub_scale [N, K/16]``,
    packed ``[N/16, 2G, 16]``, a group's two halves one after the other (``gemm_iq4.h``'s iq4h)."""

    kind = "iq4h"
    kernel_kind = 10
    sub_block = HALF_GROUP

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> IQ4HalfPart:
        """iq4's quantization, each group's sub-scale given to both its halves."""
        codes, table, sub_scale, d = IQ4Part.from_float(weight).blocks()
        return cls.from_blocks(codes, table, sub_scale.repeat_interleave(2, dim=1), d)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.iq4h_matmul(rows, self.codes, self.table, self.sub_scale, self.d, out, column)

    @staticmethod
    def affine(codes: torch.Tensor, table: torch.Tensor, sub_scale: torch.Tensor, d: torch.Tensor) -> Affine:
        return table_affine(codes, table, sub_scale, d, HALF_GROUP)


def table_affine(
    codes: torch.Tensor, table: torch.Tensor, sub_scale: torch.Tensor, d: torch.Tensor, sub_block: int
) -> Affine:
    """iq4's and iq4h's plain fields as values and scales (d · sub_scale) per sub-block of ``sub_block`` weights."""
    rows, blocks = sub_scale.shape
    per_super = GROUPS_PER_SUPER * GROUP // sub_block
    scale = d[:, torch.arange(blocks) // per_super].float() * sub_scale.float()  # [rows, B]
    lookup = table[0].to(torch.int8) if len(table) else torch.zeros(16, dtype=torch.int8)  # one for all rows
    values = lookup[codes.to(torch.int32)]  # int32 indices: half int64's bytes
    return Affine(values.reshape(rows, blocks, sub_block), scale, None)

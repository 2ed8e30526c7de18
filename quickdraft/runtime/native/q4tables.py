"""Weight parts of 4-bit codes indexing a table of 16 int8 values, under q8's float16 scale per group of 32
(``gemm_q8.h``'s q4t and q4tm):

- ``q4t``: w = d · table[code]. A GGUF file's Q4_0 (table −8..7), IQ4_NL (llama.cpp's ``kvalues_iq4nl``) and MXFP4
  (e2m1's values, doubled) tensors load into it exactly.
- ``q4tm``: w = d · table[code] + m, a float16 min per group: Q4_1 (table 0..15).

The sums are q8's and q8m's (the table's values are the codes); the codes are stored as q4's nibbles, so a step
reads 4.5 or 5 bits a weight, as llama.cpp does, instead of q8's 8.5 or 9.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from quickdraft.runtime.native.iquants import IQ4_VALUES
from quickdraft.runtime.native.kquants import lanes_last, pack_nibbles, rows_first, unpack_nibbles
from quickdraft.runtime.native.parts import (
    GROUP,
    LANES,
    Affine,
    BlockPart,
    check_float16,
    codes_above_minimum,
    group_sums_reference,
    pad_rows,
    padded,
    table_key,
)

Q4_0_TABLE = torch.arange(-8, 8, dtype=torch.int8)  # Q4_0: w = d · (code − 8)
Q4_1_TABLE = torch.arange(16, dtype=torch.int8)  # Q4_1: w = d · code + m
IQ4_NL_TABLE = IQ4_VALUES  # IQ4_NL: w = d · kvalues_iq4nl[code]
E2M1_TABLE = torch.tensor(  # MXFP4 (w = 2^(e − 128) · kvalues_mxfp4[code]) and NVFP4: e2m1's values doubled
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.int8
)


class Q4TablePart(BlockPart):
    """4-bit codes into a table of 16 int8 values, a float16 scale per group of 32 (the module docstring). Plain, each
    row has its table (``[N, 16]``, one for all the rows of a part); packed as ``codes [N/16, G, 4, 16, 4]`` (q4's
    nibbles), ``table [N/16, 16]`` int8 (a panel's) and ``d [N/16, G, 16]`` float16."""

    kind = "q4t"
    kernel_kind = 7
    tensor_names: ClassVar[tuple[str, ...]] = ("codes", "table", "d")  # then each per-group float16 tensor

    def __init__(self, rows: int, **tensors: torch.Tensor) -> None:
        self.rows, self.codes = rows, tensors["codes"].contiguous()
        self.table = tensors["table"].to(torch.int8).contiguous()
        for name in self.tensor_names[2:]:
            setattr(self, name, tensors[name].to(torch.float16).contiguous())
        self.in_features = self.codes.shape[1] * GROUP

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, table: torch.Tensor, *groups: torch.Tensor) -> Q4TablePart:
        """Plain ``codes [N, K]`` in [0, 15], each row's ``table [N, 16]`` of the values they index (the same for every
        row) and the per-group tensors ``[N, K/32]`` (float16 values; q4t: ``d``) -> the packed part."""
        rows, width = codes.shape
        if width % GROUP:
            raise ValueError(f"{cls.kind} weights need a multiple of {GROUP} input features, got {width}")
        if codes.numel() and not 0 <= int(codes.min()) <= int(codes.max()) <= 15:
            raise ValueError(f"{cls.kind} codes are in [0, 15]")
        if table.shape != (rows, 16) or not bool((table == table[:1]).all()):
            raise ValueError(f"{cls.kind} weights take one table of 16 values for all their rows")
        if table.numel() and not -128 <= int(table.min()) <= int(table.max()) <= 127:
            raise ValueError(f"{cls.kind} table values are int8")
        if len(groups) != len(cls.tensor_names) - 2:
            raise ValueError(f"{cls.kind} weights take {', '.join(cls.tensor_names[2:])} per group")
        for values in groups:
            check_float16(cls.kind, values)
        nibbles = pad_rows(codes.to(torch.uint8), padded(rows)).reshape(-1, LANES, width // GROUP, 8, 4)
        lanes = [lanes_last(values.to(torch.float16)) for values in groups]  # each [N/16, G, 16]
        tables = table[:1].to(torch.int8).expand(padded(rows) // LANES, 16)  # [N/16, 16]
        fields = (pack_nibbles(nibbles), tables, *lanes)  # codes [N/16, G, 4, 16, 4]
        return cls(rows, **dict(zip(cls.tensor_names, fields, strict=True)))

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q4TablePart:
        """llama.cpp's Q4_0 rule (a GGUF file's own blocks are loaded exactly instead): each group's scale maps its
        largest magnitude to −8, the table's far end; codes round to the nearest step."""
        if weight.shape[1] % GROUP:
            raise ValueError(f"{cls.kind} weights need a multiple of {GROUP} input features, got {weight.shape[1]}")
        groups = weight.float().reshape(weight.shape[0], -1, GROUP)  # [N, G, 32]
        extreme = groups.gather(-1, groups.abs().argmax(dim=-1, keepdim=True))[..., 0]  # [N, G]: signed
        d = (extreme / -8).to(torch.float16)
        safe = torch.where(d == 0, torch.ones_like(d), d).float()[..., None]
        codes = (torch.round(groups / safe) + 8).clamp_(0, 15).to(torch.uint8)
        return cls.from_blocks(codes.reshape(weight.shape), Q4_0_TABLE.expand(len(codes), 16), d)

    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The plain ``(codes, table, d, ...)`` of :meth:`from_blocks` (the per-group tensors as float32 values)."""
        codes = unpack_nibbles(self.codes).reshape(self.padded_rows, self.in_features)[: self.rows]
        groups = [rows_first(getattr(self, name), self.rows).float() for name in self.tensor_names[2:]]
        return (codes, self.table.repeat_interleave(LANES, dim=0)[: self.rows], *groups)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q4t_matmul(rows, self.codes, self.table, self.d, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        fields = self.blocks()
        values = self.affine(*fields).values.reshape(self.rows, -1)  # [N, K]: table[code]
        d, *mins = fields[2:]
        return group_sums_reference(rows, values, d, mins[0] if mins else None)

    @staticmethod
    def join_key(fields: tuple[torch.Tensor, ...]) -> Hashable:
        return table_key(fields[1])

    @staticmethod
    def affine(codes: torch.Tensor, table: torch.Tensor, d: torch.Tensor, *mins: torch.Tensor) -> Affine:
        lookup = table[0].to(torch.int8) if len(table) else torch.zeros(16, dtype=torch.int8)  # one for all rows
        values = lookup[codes.to(torch.int32)].reshape(len(codes), -1, GROUP)  # [N, G, 32]; int32 indices: 4 bytes
        return Affine(values, d.float(), mins[0].float() if mins else None)


class Q4TableMinPart(Q4TablePart):
    """q4t with a float16 min per group (llama.cpp's Q4_1 structure): w = d · table[code] + m. Packed as q4t, and the
    mins ``[N/16, G, 16]`` as its scales (``gemm_q8.h``'s q4tm)."""

    kind = "q4tm"
    kernel_kind = 8
    tensor_names = ("codes", "table", "d", "mins")

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q4TablePart:
        """llama.cpp's Q4_1 rule: codes in [0, 15] above each group's minimum, rounded to the nearest step."""
        codes, d, low = codes_above_minimum(cls.kind, weight, 15)
        return cls.from_blocks(codes.to(torch.uint8), Q4_1_TABLE.expand(len(codes), 16), d, low)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q4tm_matmul(rows, self.codes, self.table, self.d, self.mins, out, column)

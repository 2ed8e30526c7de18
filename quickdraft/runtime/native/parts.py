"""Packed weight formats of the native runtime's linear layers (``gemm.h``, ``gemm_q6.h``): a part is a range of a
layer's output rows in one format. Each format's integer products are summed exactly (int32) and then finished by
a fixed sequence of float operations, the same on every instruction set and in :meth:`WeightPart.reference`.

This module holds the parts' interface, their shared packing helpers and two formats of 8-bit codes:

- ``int8``: 7-bit weights per output channel (symmetric, scale = row max / 63): out = float(Σ x·w) · scale.
  7 bits keep AVX2's u8 × s8 pair sums below 2^15, so the same weights serve every instruction set.
- ``q8``: llama.cpp's Q8_0 structure, codes in [−128, 127] under a float16 scale per group of 32: out = the groups'
  exact integer sums, each into a float sum by one fused multiply-add with its scale. A GGUF file's Q8_0 and Q5_0
  tensors load into it exactly; ``q8m`` adds a float16 min per group (w = d · q + m: Q5_1). The 4-bit ones (Q4_0,
  Q4_1, IQ4_NL) load into ``q4tables.py``'s q4t and q4tm: the same sums, half the bytes.

The formats in llama.cpp's K-quant structures are in ``kquants.py`` (q4, q5, q6) and ``q2k.py`` (q2), its i-quant
one (iq4) in ``iquants.py``, q8's with 4-bit table codes (q4t, q4tm) in ``q4tables.py``; ``formats.py`` names every
format (``PART_KINDS``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from typing import Any, ClassVar, NamedTuple

import torch

from quickdraft.runtime.native.float_ops import fused_multiply_add

WEIGHT_LEVELS = 63.0  # 7-bit int8 weights: |w| <= 63 keeps AVX2's u8 x s8 pair sums below 2^15
LANES = 16  # outputs per block of the packed layouts (one 512-bit vector)
INT8_OFFSET = 64  # int8 codes hold w + 64
GROUP = 32  # q8 (and the K-quant formats): weights per group
Q8_OFFSET = 128  # q8 codes hold q + 128
CODE_ROWS = 1024  # rows rounded to codes or packed at a time


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (int8 ``[N, K]`` in [−63, 63], float32 scale ``[N]``), symmetric per output channel."""
    weight = weight.float()
    scale = (weight.abs().amax(dim=1) / WEIGHT_LEVELS).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scale[:, None]).clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS).to(torch.int8), scale


def padded(rows: int) -> int:
    return -(-rows // LANES) * LANES


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` (the packed layouts hold whole blocks of 16 outputs)."""
    extra = rows - tensor.shape[0]
    return tensor if extra == 0 else torch.cat([tensor, tensor.new_zeros(extra, *tensor.shape[1:])])


def row_chunks(rows: int) -> list[slice]:
    """The rows ``[0, rows)`` CODE_ROWS at a time."""
    return [slice(first, first + CODE_ROWS) for first in range(0, rows, CODE_ROWS)]


def packed_by_chunks(rows: int, pack: Callable[[slice], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Packed tensors ``[N/16, ...]`` by name, written CODE_ROWS rows at a time: ``pack(rows)`` gives the panels of
    those rows (the last zero-padded to a whole panel), so a part's temporaries stay a few MB, in the cache."""
    packed: dict[str, torch.Tensor] = {}
    for chunk in row_chunks(max(rows, 1)):  # one empty chunk for no rows: empty tensors of the right shape
        first = chunk.start // LANES  # CODE_ROWS is a whole number of panels
        for name, piece in pack(chunk).items():
            if name not in packed:
                packed[name] = piece.new_empty(padded(rows) // LANES, *piece.shape[1:])
            packed[name][first : first + len(piece)] = piece
    return packed


def panels_of(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``index`` of a packed part: (the 16-row panels holding them, sorted; each row's place among those
    panels' rows). Selecting rows unpacks only their panels, so a few rows of a large LM head come quickly."""
    panel_ids, which = torch.unique(index // LANES, return_inverse=True)
    return panel_ids, which * LANES + index % LANES


def check_float16(kind: str, values: torch.Tensor) -> None:
    """Raise unless every one of a ``kind`` part's ``values`` (its per-group scales) is a float16 value."""
    if not torch.allclose(values.to(torch.float16).float(), values.float(), rtol=0.0, atol=0.0, equal_nan=True):
        raise ValueError(f"{kind} scales must be float16 values")


def codes_above_minimum(kind: str, weight: torch.Tensor, top: int) -> tuple[torch.Tensor, ...]:
    """Float ``weight [N, K]`` -> round-to-nearest ``codes [N, K]`` in [0, top] above each group of 32's minimum,
    ``d`` and ``low [N, K/32]`` float16 (w ≈ d · code + low: llama.cpp's Q4_1 and Q5_1 rule)."""
    if weight.shape[1] % GROUP:
        raise ValueError(f"{kind} weights need a multiple of {GROUP} input features, got {weight.shape[1]}")
    groups = weight.float().reshape(weight.shape[0], -1, GROUP)  # [N, G, 32]
    low = groups.amin(dim=-1).to(torch.float16)  # [N, G]
    d = ((groups.amax(dim=-1) - low.float()) / top).to(torch.float16)
    safe = torch.where(d == 0, torch.ones_like(d), d).float()[..., None]
    codes = torch.round((groups - low.float()[..., None]) / safe).clamp_(0, top)
    return codes.reshape(weight.shape), d, low


def group_sums_reference(
    rows: torch.Tensor, values: torch.Tensor, d: torch.Tensor, mins: torch.Tensor | None
) -> torch.Tensor:
    """q8's arithmetic (``gemm_q8.h``) in PyTorch operations: integer-valued float ``rows [M, K]``, integer weight
    ``values [N, K]``, float ``d`` (and ``mins``) ``[N, K/32]`` -> ``[M, N]``: over the groups in order, the group's
    exact integer sum times d into the float sum by one fused multiply-add (then the min times the row's group sum)."""
    groups = values.shape[1] // GROUP
    x = rows.double().reshape(rows.shape[0], groups, GROUP)  # [M, G, 32]
    dots = torch.einsum("mgk,ngk->mng", x, values.double().reshape(len(values), groups, GROUP)).float()  # exact
    sums = x.sum(-1).float()  # [M, G] exact
    acc = torch.zeros(rows.shape[0], len(values))
    for g in range(groups):
        acc = fused_multiply_add(d[:, g], dots[:, :, g], acc)
        if mins is not None:  # the group's min times the row's sum over the group
            acc = fused_multiply_add(mins[:, g], sums[:, g, None].expand_as(acc), acc)
    return acc


class WeightPart(ABC):
    """A range of a linear layer's output rows in one packed format."""

    kind: ClassVar[str]
    kernel_kind: ClassVar[int]  # its number in layers.h's Part
    tensor_names: ClassVar[tuple[str, ...]]
    rows: int  # output rows this part holds (its packed tensors hold them padded to a multiple of 16)
    in_features: int

    @property
    def padded_rows(self) -> int:
        return padded(self.rows)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The packed tensors by name, in ``tensor_names``' order (what the native weight cache stores, and the order
        layers.h's Part takes them in)."""
        return {name: getattr(self, name) for name in self.tensor_names}

    @classmethod
    def from_tensors(cls, rows: int, tensors: dict[str, torch.Tensor]) -> WeightPart:
        """The part :meth:`tensors` gave ``tensors``."""
        return cls(rows, **tensors)  # type: ignore[call-arg]  # each format's constructor takes its tensor_names

    @classmethod
    @abstractmethod
    def from_float(cls, weight: torch.Tensor) -> WeightPart:
        """Quantize float weights ``[rows, K]`` into this format."""

    @abstractmethod
    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        """The compiled GEMM of int8 ``rows [M, K]`` into ``out[:, column : column + padded_rows]``."""

    @abstractmethod
    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        """The same result from PyTorch operations: integer-valued float ``rows [M, K]`` -> ``[M, rows]``."""

    @abstractmethod
    def dequantize(self) -> torch.Tensor:
        """The float weights this part stands for, ``[rows, K]``."""

    @abstractmethod
    def select_rows(self, index: torch.Tensor) -> WeightPart:
        """A part of the rows ``index`` (in that order), with the same weights."""


class Affine(NamedTuple):
    """Block weights as integer ``values [N, G, S]`` (int8) times a float32 ``scale [N, G]`` per group of S, plus a
    float32 ``offset [N, G]`` where the format has one: w = value · scale (+ offset), in float32, the float operations
    llama.cpp's and gguf-py's dequantization perform."""

    values: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None

    def select(self, index: torch.Tensor) -> Affine:
        """The rows ``index`` (any order, repeats allowed)."""
        return Affine(self.values[index], self.scale[index], None if self.offset is None else self.offset[index])

    def dequantize(self) -> torch.Tensor:
        """The float weights ``[N, G·S]``."""
        weights = self.values.to(torch.float32, copy=True).mul_(self.scale[..., None])  # [N, G, S], one new tensor
        if self.offset is not None:
            weights.add_(self.offset[..., None])
        return weights.reshape(len(weights), -1)


class BlockPart(WeightPart):
    """A format whose weights are plain per-row fields (codes and their scales) before packing: :meth:`blocks` gives
    them, :meth:`from_blocks` packs them, so picking rows is unpacking a part's 16-row panels and packing again.
    :meth:`affine` is the one place a format's dequantization arithmetic lives."""

    @classmethod
    @abstractmethod
    def from_blocks(cls, *fields: torch.Tensor) -> BlockPart:
        """The packed part of plain fields, each ``[rows, ...]``."""

    @abstractmethod
    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The plain fields of :meth:`from_blocks`."""

    @staticmethod
    @abstractmethod
    def affine(*fields: torch.Tensor) -> Affine:
        """Plain fields (as :meth:`from_blocks` takes them) as values, scales and offsets per group."""

    @staticmethod
    def join_key(fields: tuple[torch.Tensor, ...]) -> Hashable:
        """What weights of this kind must share for their plain fields to be joined into one part (rows
        concatenated): nothing, but for formats with a table for all their rows (q4t, q4tm, iq4, iq4h), that table."""
        return None

    def dequantize(self) -> torch.Tensor:
        return self.affine(*self.blocks()).dequantize()

    def select_rows(self, index: torch.Tensor) -> BlockPart:
        panel_ids, local = panels_of(index)
        panels = self.from_tensors(len(panel_ids) * LANES, {name: t[panel_ids] for name, t in self.tensors().items()})
        return self.from_blocks(*(field[local] for field in panels.blocks()))


def table_key(table: torch.Tensor) -> tuple[int, ...]:
    """A part's table of 16 values (plain ``[N, 16]``, one for all rows) as a join key (``BlockPart.join_key``)."""
    return tuple(table[0].tolist()) if len(table) else ()


class Int8Part(WeightPart):
    """7-bit weights and a float scale per output channel; packed ``[N/16, K/4, 16, 4]`` as w + 64."""

    kind = "int8"
    kernel_kind = 0
    tensor_names = ("codes", "scale")

    def __init__(self, rows: int, codes: torch.Tensor, scale: torch.Tensor) -> None:
        self.rows, self.codes, self.scale = rows, codes.contiguous(), scale.float().contiguous()
        self.in_features = codes.shape[1] * 4

    @classmethod
    def from_int8(cls, weight_int8: torch.Tensor, scale: torch.Tensor) -> Int8Part:
        """``[N, K]`` int8 in [−63, 63] and ``[N]`` scales (``quantize_weight``) -> the packed part."""
        low, high = torch.aminmax(weight_int8)  # not abs(): int8 abs(-128) stays -128
        if int(low) < -WEIGHT_LEVELS or int(high) > WEIGHT_LEVELS:
            raise ValueError("int8 weights must be quantized to [-63, 63] (quantize_weight)")
        rows, width = weight_int8.shape
        if width % 4:
            raise ValueError(f"int8 weights need a multiple of 4 input features, got {width}")
        codes = (pad_rows(weight_int8, padded(rows)).to(torch.int16) + INT8_OFFSET).to(torch.uint8)
        codes = codes.reshape(-1, LANES, width // 4, 4).permute(0, 2, 1, 3)  # [N/16, K/4, 16, 4]
        return cls(rows, codes, pad_rows(scale.float(), padded(rows)))

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Part:
        return cls.from_int8(*quantize_weight(weight))

    def weight_int8(self) -> torch.Tensor:
        """``[rows, K]`` int8, unpacked."""
        codes = self.codes.permute(0, 2, 1, 3).reshape(self.padded_rows, self.in_features)
        return (codes.to(torch.int16) - INT8_OFFSET).to(torch.int8)[: self.rows]

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.int8_matmul(rows, self.codes, self.scale, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        exact = rows.double() @ self.weight_int8().double().T  # integers below 2^53: exact in float64
        return exact.float() * self.scale[: self.rows]

    def dequantize(self) -> torch.Tensor:
        return self.weight_int8().float() * self.scale[: self.rows, None]

    def select_rows(self, index: torch.Tensor) -> Int8Part:
        panel_ids, local = panels_of(index)
        scale = self.scale.reshape(-1, LANES)[panel_ids].flatten()
        panels = Int8Part(len(panel_ids) * LANES, self.codes[panel_ids], scale)
        return Int8Part.from_int8(panels.weight_int8()[local], panels.scale[local])


class Q8Part(BlockPart):
    """8-bit codes in groups of 32 with a float16 scale each (llama.cpp's Q8_0 structure; Q5_0 blocks are the same
    with smaller codes): w = d · q, q in [−128, 127]. Packed as ``gemm_q8.h`` describes: int8's layout
    holding q + 128, and the scales ``[N/16, K/32, 16]``."""

    kind = "q8"
    kernel_kind = 4
    tensor_names: ClassVar[tuple[str, ...]] = ("codes", "d")  # then each per-group float16 tensor

    def __init__(self, rows: int, **tensors: torch.Tensor) -> None:
        self.rows, self.codes = rows, tensors["codes"].contiguous()
        for name in self.tensor_names[1:]:
            setattr(self, name, tensors[name].to(torch.float16).contiguous())
        self.in_features = self.codes.shape[1] * 4

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, *groups: torch.Tensor) -> Q8Part:
        """Plain ``codes [N, K]`` int8 and the per-group tensors ``[N, K/32]`` (float16 values; q8: ``d``) -> the
        packed part."""
        rows, width = codes.shape
        if width % GROUP:
            raise ValueError(f"{cls.kind} weights need a multiple of {GROUP} input features, got {width}")
        if len(groups) != len(cls.tensor_names) - 1:
            raise ValueError(f"{cls.kind} weights take {', '.join(cls.tensor_names[1:])} per group")
        for values in groups:
            check_float16(cls.kind, values)

        def pack(chunk: slice) -> dict[str, torch.Tensor]:
            unsigned = codes[chunk].to(torch.int8).view(torch.uint8) ^ Q8_OFFSET  # q + 128, as a byte
            unsigned = pad_rows(unsigned, padded(len(unsigned)))
            return {"codes": unsigned.reshape(-1, LANES, width // 4, 4).permute(0, 2, 1, 3)}  # [n/16, K/4, 16, 4]

        lanes = [pad_rows(values.to(torch.float16), padded(rows)).reshape(-1, LANES, width // GROUP).permute(0, 2, 1)
                 for values in groups]  # each [N/16, K/32, 16]  # fmt: skip
        return cls(rows, **packed_by_chunks(rows, pack), **dict(zip(cls.tensor_names[1:], lanes, strict=True)))

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q8Part:
        """Round-to-nearest 8-bit codes under a float16 scale per group of 32, as llama.cpp's Q8_0 (a GGUF file's
        own blocks are loaded exactly instead)."""
        if weight.shape[1] % GROUP:
            raise ValueError(f"q8 weights need a multiple of {GROUP} input features, got {weight.shape[1]}")
        groups = weight.float().reshape(weight.shape[0], -1, GROUP)  # [N, G, 32]
        d = (groups.abs().amax(dim=-1) / 127).to(torch.float16)  # [N, G]
        safe = torch.where(d == 0, torch.ones_like(d), d).float()[..., None]
        codes = torch.round(groups / safe).clamp_(-128, 127).to(torch.int8)
        return cls.from_blocks(codes.reshape(weight.shape), d)

    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The plain ``(codes, d, ...)`` of :meth:`from_blocks` (the per-group tensors as float32 values)."""
        codes = self.codes.permute(0, 2, 1, 3).reshape(self.padded_rows, self.in_features)[: self.rows]
        groups = [getattr(self, name).permute(0, 2, 1).reshape(self.padded_rows, -1)[: self.rows].float()
                  for name in self.tensor_names[1:]]  # fmt: skip
        return ((codes.to(torch.int16) - Q8_OFFSET).to(torch.int8), *groups)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q8_matmul(rows, self.codes, self.d, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        codes, d, *mins = self.blocks()
        return group_sums_reference(rows, codes, d, mins[0] if mins else None)

    @staticmethod
    def affine(codes: torch.Tensor, d: torch.Tensor, *mins: torch.Tensor) -> Affine:
        values = codes.to(torch.int8).reshape(len(codes), -1, GROUP)  # [N, G, 32]
        return Affine(values, d.float(), mins[0].float() if mins else None)


class Q8MinPart(Q8Part):
    """q8 with a float16 min per group (llama.cpp's Q5_1 structure): w = d · q + m. Packed as q8, and the
    mins ``[N/16, K/32, 16]`` as its scales (``gemm_q8.h``'s q8m)."""

    kind = "q8m"
    kernel_kind = 5
    tensor_names = ("codes", "d", "mins")

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q8Part:
        """Round-to-nearest codes in [0, 31] above each group's minimum (llama.cpp's Q5_1 rule)."""
        codes, d, low = codes_above_minimum(cls.kind, weight, 31)
        return cls.from_blocks(codes.to(torch.int8), d, low)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q8m_matmul(rows, self.codes, self.d, self.mins, out, column)

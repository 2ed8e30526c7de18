"""Packed weight formats of the native runtime's linear layers (``gemm.h``, ``gemm_q6.h``): a part is a range of a
layer's output rows in one format. Each format's integer products are summed exactly (int32) and then finished by
a fixed sequence of float operations, the same on every instruction set and in :meth:`WeightPart.reference`:

- ``int8``: 7-bit weights per output channel (symmetric, scale = row max / 63): out = float(Σ x·w) · scale.
  7 bits keep AVX2's u8 × s8 pair sums below 2^15, so the same weights serve every instruction set.
- ``q4``: llama.cpp's Q4_K structure: 4-bit codes in groups of 32, each group with an 8-bit sub-scale and
  sub-min under float superblock scales (d, dmin) per 8 groups: w = d · sub_scale · code + dmin · sub_min.
- ``q6``: llama.cpp's Q6_K structure: 6-bit codes in sub-blocks of 16, each with a signed 8-bit sub-scale, under
  a float d per superblock of 256: w = d · sub_scale · (code − 32).

A GGUF file's Q4_K and Q6_K tensors load into q4 and q6 parts exactly, with no second quantization
(``gguf_blocks.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from quickdraft.runtime.native.float_ops import fused_multiply_add

WEIGHT_LEVELS = 63.0  # 7-bit int8 weights: |w| <= 63 keeps AVX2's u8 x s8 pair sums below 2^15
LANES = 16  # outputs per block of the packed layouts (one 512-bit vector)
GROUP = 32  # q4: weights per group; q6: per pair of sub-blocks
GROUPS_PER_SUPER = 8  # q4 and q6: groups per superblock
INT8_OFFSET = 64  # int8 codes hold w + 64
SUB_BLOCK = 16  # q6: weights per sub-scale
Q6_OFFSET = 32  # q6 codes hold w / (d · sub_scale) + 32


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


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[N/16, 16, G, 8, 4]`` (lane, group, code vector j, byte i) -> bytes ``[N/16, G, 4, 16, 4]``
    holding vector j in the low nibble and vector j + 4 in the high one (``gemm.h``'s q4 codes)."""
    return (codes[:, :, :, :4] | (codes[:, :, :, 4:] << 4)).permute(0, 2, 3, 1, 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_nibbles`' inverse: ``[N/16, G, 4, 16, 4]`` -> ``[N/16, 16, G, 8, 4]``."""
    packed = packed.permute(0, 3, 1, 2, 4)  # [N/16, 16, G, 4, 4]
    return torch.cat([packed & 0x0F, packed >> 4], dim=3)


def panels_of(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``index`` of a packed part: (the 16-row panels holding them, sorted; each row's place among those
    panels' rows). Selecting rows unpacks only their panels, so a few rows of a large LM head come quickly."""
    panel_ids, which = torch.unique(index // LANES, return_inverse=True)
    return panel_ids, which * LANES + index % LANES


class WeightPart(ABC):
    """A range of a linear layer's output rows in one packed format."""

    kind: ClassVar[str]
    kernel_kind: ClassVar[int]  # its number in layers.cpp's Part
    tensor_names: ClassVar[tuple[str, ...]]
    rows: int  # output rows this part holds (its packed tensors hold them padded to a multiple of 16)
    in_features: int

    @property
    def padded_rows(self) -> int:
        return padded(self.rows)

    @abstractmethod
    def tensors(self) -> dict[str, torch.Tensor]:
        """The packed tensors by name (what the native weight cache stores)."""

    @classmethod
    @abstractmethod
    def from_tensors(cls, rows: int, tensors: dict[str, torch.Tensor]) -> WeightPart: ...

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

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "scale": self.scale}

    @classmethod
    def from_tensors(cls, rows: int, tensors: dict[str, torch.Tensor]) -> Int8Part:
        return cls(rows, tensors["codes"], tensors["scale"])

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


class Q4Part(WeightPart):
    """4-bit codes in Q4_K's structure (see the module docstring); packed as ``gemm.h`` describes."""

    kind = "q4"
    kernel_kind = 1
    tensor_names = ("codes", "sub_scale", "sub_min", "d", "dmin")

    def __init__(self, rows: int, **tensors: torch.Tensor) -> None:
        self.rows = rows
        self.codes, self.sub_scale, self.sub_min = (tensors[name].contiguous() for name in self.tensor_names[:3])
        self.d, self.dmin = (tensors[name].float().contiguous() for name in self.tensor_names[3:])
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
        """Plain ``codes [N, K]`` in [0, 15], ``sub_scale``/``sub_min [N, K/32]`` in [0, 255] and float ``d``/``dmin
        [N, K/256]`` (w = d · sub_scale · code + dmin · sub_min) -> the packed part. K must be a multiple of 64."""
        rows, width = codes.shape
        if width % (2 * GROUP):
            raise ValueError(f"q4 weights need a multiple of {2 * GROUP} input features, got {width}")
        codes = pad_rows(codes.to(torch.uint8), padded(rows)).reshape(-1, LANES, width // GROUP, 8, 4)
        return cls(
            rows,
            codes=pack_nibbles(codes),  # [N/16, G, 4, 16, 4]
            sub_scale=lanes_last(sub_scale.to(torch.uint8)),
            sub_min=lane_pairs(sub_min.to(torch.uint8)),
            d=lanes_last(d.float()),
            dmin=lanes_last(dmin.float()),
        )

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q4Part:
        """Round-to-nearest 4-bit quantization of float weights into the Q4_K structure (for models that come
        without it; a GGUF file's own Q4_K blocks are loaded exactly instead)."""
        groups = weight.float().reshape(weight.shape[0], -1, GROUP)  # [N, G, 32]
        low = groups.amin(dim=-1).clamp(max=0.0)  # like llama.cpp: the offset is never positive
        return cls.from_groups(weight, low, (groups.amax(dim=-1) - low).clamp_min(1e-30) / 15)

    @classmethod
    def from_groups(cls, weight: torch.Tensor, low: torch.Tensor, step: torch.Tensor, levels: int = 15) -> Q4Part:
        """``weight [N, K]`` as w ≈ step · code + low per group of 32 (``low`` <= 0, ``step``: [N, G]), code in [0,
        levels] stored as the Q4_K code · (15 // levels): ``levels`` 3 and 7 give 2- and 3-bit codes."""
        if not 1 <= levels <= 15:
            raise ValueError(f"q4 codes hold 1 to 15 levels above zero, not {levels}")
        stretch = 15 // levels  # the Q4_K step is step / stretch
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
        codes = torch.round((groups - offset) / scale).clamp_(0, levels) * stretch
        return cls.from_blocks(codes.to(torch.uint8).reshape(rows, width), sub_scale, sub_min, d, -dmin_magnitude)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.tensor_names}

    @classmethod
    def from_tensors(cls, rows: int, tensors: dict[str, torch.Tensor]) -> Q4Part:
        return cls(rows, **tensors)

    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The plain ``(codes, sub_scale, sub_min, d, dmin)`` of :meth:`from_blocks`."""
        codes = unpack_nibbles(self.codes).reshape(self.padded_rows, self.in_features)[: self.rows]
        sub_min = rows_from_pairs(self.sub_min, self.rows)
        sub_scale, d, dmin = (rows_first(t, self.rows) for t in (self.sub_scale, self.d, self.dmin))
        return codes, sub_scale, sub_min, d, dmin

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q4_matmul(rows, self.codes, self.sub_scale, self.sub_min, self.d, self.dmin, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        codes, sub_scale, sub_min, d, dmin = self.blocks()
        groups = self.in_features // GROUP
        x = rows.double().reshape(rows.shape[0], groups, GROUP)  # [M, G, 32]
        dots = torch.einsum("mgk,ngk->mng", x, codes.double().reshape(self.rows, groups, GROUP))  # exact
        sums = x.sum(-1)  # [M, G] exact
        acc = torch.zeros(rows.shape[0], self.rows)
        for first in range(0, groups, GROUPS_PER_SUPER):
            s = first // GROUPS_PER_SUPER
            span = range(first, min(first + GROUPS_PER_SUPER, groups))
            total = sum(dots[:, :, g] * sub_scale[:, g].double() for g in span)  # integers: exact
            acc = fused_multiply_add(d[:, s], total.float(), acc)
            offset = sum(sums[:, g, None] * sub_min[:, g].double() for g in span)  # integers: exact
            acc = fused_multiply_add(dmin[:, s], offset.float(), acc)
        return acc

    def dequantize(self) -> torch.Tensor:
        codes, sub_scale, sub_min, d, dmin = self.blocks()
        groups = self.in_features // GROUP
        index = torch.arange(groups) // GROUPS_PER_SUPER
        scale = (d[:, index] * sub_scale.float())[..., None]  # [rows, G, 1]
        offset = (dmin[:, index] * sub_min.float())[..., None]
        return (scale * codes.reshape(self.rows, groups, GROUP).float() + offset).reshape(self.rows, -1)

    def select_rows(self, index: torch.Tensor) -> Q4Part:
        panel_ids, local = panels_of(index)
        panels = Q4Part(len(panel_ids) * LANES, **{name: t[panel_ids] for name, t in self.tensors().items()})
        return Q4Part.from_blocks(*(field[local] for field in panels.blocks()))


class Q6Part(WeightPart):
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
        groups = width // GROUP
        codes = pad_rows(codes.to(torch.uint8), padded(rows)).reshape(-1, LANES, groups, 8, 4)  # [.., j, i]
        top = (codes >> 4).reshape(-1, LANES, groups, 2, 4, 4)  # code vector 4h + c: [.., h, c, i]
        high = top[:, :, :, :, 0] | (top[:, :, :, :, 1] << 2) | (top[:, :, :, :, 2] << 4) | (top[:, :, :, :, 3] << 6)
        return cls(
            rows,
            codes=pack_nibbles(codes & 0x0F),  # [N/16, G, 4, 16, 4]
            high=high.permute(0, 2, 3, 1, 4),  # [N/16, G, 2, 16, 4]
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

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.tensor_names}

    @classmethod
    def from_tensors(cls, rows: int, tensors: dict[str, torch.Tensor]) -> Q6Part:
        return cls(rows, **tensors)

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The plain ``(codes, sub_scale, d)`` of :meth:`from_blocks`."""
        low = unpack_nibbles(self.codes)  # [N/16, 16, G, 8, 4]
        high = self.high.permute(0, 3, 1, 2, 4)  # [N/16, 16, G, 2, 4]
        top = torch.stack([(high >> (2 * c)) & 3 for c in range(4)], dim=4).reshape(low.shape)  # [.., 2·4, 4]
        codes = (low | (top << 4)).reshape(self.padded_rows, self.in_features)[: self.rows]
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

    def dequantize(self) -> torch.Tensor:
        codes, sub_scale, d = self.blocks()
        index = torch.arange(self.in_features // SUB_BLOCK) // (2 * GROUPS_PER_SUPER)
        scale = (d[:, index] * sub_scale.float())[..., None]  # [rows, J, 1]
        values = codes.reshape(self.rows, -1, SUB_BLOCK).float() - Q6_OFFSET
        return (scale * values).reshape(self.rows, -1)

    def select_rows(self, index: torch.Tensor) -> Q6Part:
        panel_ids, local = panels_of(index)
        panels = Q6Part(len(panel_ids) * LANES, **{name: t[panel_ids] for name, t in self.tensors().items()})
        return Q6Part.from_blocks(*(field[local] for field in panels.blocks()))


PART_KINDS: dict[str, type[WeightPart]] = {part.kind: part for part in (Int8Part, Q4Part, Q6Part)}

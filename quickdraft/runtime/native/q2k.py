"""The ``q2`` weight part: llama.cpp's Q2_K structure (``gemm_q2.h``), 2-bit codes in sub-blocks of 16, each with a
4-bit sub-scale and a 4-bit sub-min, under float superblock scales (d, dmin) per 256 weights:
w = d · sub_scale · code + dmin · sub_min. A GGUF file's Q2_K tensors load into it exactly (``gguf_blocks.py``, with
the file's dmin negated), so a step reads 2.75 bits a weight, where 7-bit int8 read 8.
"""

from __future__ import annotations

from typing import Any

import torch

from quickdraft.runtime.native.kquants import (
    GROUPS_PER_SUPER,
    code_panels,
    lane_pairs,
    lanes_last,
    pack_bit_pairs,
    rows_first,
    rows_from_pairs,
    superblock_affine,
    superblock_reference,
    unpack_bit_pairs,
)
from quickdraft.runtime.native.parts import GROUP, Affine, BlockPart, packed_by_chunks

SUB_BLOCK = 16  # weights per sub-scale and sub-min
SUBS_PER_SUPER = 2 * GROUPS_PER_SUPER  # sub-blocks per superblock of 256
LEVELS = 15  # sub-scales and sub-mins are 4 bits


class Q2Part(BlockPart):
    """2-bit codes in Q2_K's structure (see the module docstring). Packed as ``codes [N/16, G, 2, 16, 4]`` (byte
    (h, l, i) holding code vector 4h + c at bits 2c), ``scales [N/16, G, 16, 2]`` uint8 (sub_scale | sub_min << 4, a
    group's two sub-blocks side by side), ``d`` and ``dmin [N/16, S, 16]`` float."""

    kind = "q2"
    kernel_kind = 9
    tensor_names = ("codes", "scales", "d", "dmin")

    def __init__(self, rows: int, **tensors: torch.Tensor) -> None:
        self.rows = rows
        self.codes, self.scales = tensors["codes"].contiguous(), tensors["scales"].contiguous()
        self.d, self.dmin = tensors["d"].float().contiguous(), tensors["dmin"].float().contiguous()
        self.in_features = self.codes.shape[1] * GROUP

    @classmethod
    def from_blocks(
        cls, codes: torch.Tensor, sub_scale: torch.Tensor, sub_min: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor
    ) -> Q2Part:
        """Plain ``codes [N, K]`` in [0, 3], ``sub_scale``/``sub_min [N, K/16]`` in [0, 15] and float ``d``/``dmin
        [N, ceil(K/256)]`` (w = d · sub_scale · code + dmin · sub_min) -> the packed part; K a multiple of 32."""
        rows, width = codes.shape
        if width % GROUP:
            raise ValueError(f"q2 weights need a multiple of {GROUP} input features, got {width}")
        if codes.numel() and int(codes.max()) > 3:
            raise ValueError(f"q2 codes are at most 3, got {int(codes.max())}")
        for name, values in (("sub-scales", sub_scale), ("sub-mins", sub_min)):
            if values.numel() and not 0 <= int(values.min()) <= int(values.max()) <= LEVELS:
                raise ValueError(f"q2 {name} are in [0, {LEVELS}]")

        def pack(chunk: slice) -> dict[str, torch.Tensor]:
            return {"codes": pack_bit_pairs(code_panels(codes, chunk))}  # [n/16, G, 2, 16, 4]

        scales = sub_scale.to(torch.uint8) | (sub_min.to(torch.uint8) << 4)  # [N, K/16]: the file's bytes
        return cls(
            rows,
            **packed_by_chunks(rows, pack),
            scales=lane_pairs(scales),  # [N/16, G, 16, 2]
            d=lanes_last(d.float()),
            dmin=lanes_last(dmin.float()),
        )

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q2Part:
        """Round-to-nearest quantization of float weights into Q2_K's structure (a GGUF file's own Q2_K blocks are
        loaded exactly instead): per sub-block w ≈ step · code + low, low <= 0, both rounded to 4 bits under the
        superblock's scales."""
        rows, width = weight.shape
        if width % GROUP:
            raise ValueError(f"q2 weights need a multiple of {GROUP} input features, got {width}")
        sub_blocks = weight.float().reshape(rows, width // SUB_BLOCK, SUB_BLOCK)  # [N, J, 16]
        low = sub_blocks.amin(dim=-1).clamp(max=0.0)
        step = (sub_blocks.amax(dim=-1) - low) / 3
        supers = -(-width // (GROUP * GROUPS_PER_SUPER))
        index = torch.arange(width // SUB_BLOCK) // SUBS_PER_SUPER  # each sub-block's superblock

        def split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [N, J] -> ([N, S], [N, J] in 0..15)
            padded = torch.nn.functional.pad(values, (0, supers * SUBS_PER_SUPER - values.shape[1]))
            top = (padded.reshape(rows, supers, SUBS_PER_SUPER).amax(-1) / LEVELS).half().float()  # [N, S]
            safe = torch.where(top == 0, torch.ones_like(top), top)  # all zero (or below float16): codes 0
            return top, torch.round(values / safe[:, index]).clamp_(0, LEVELS).to(torch.uint8)

        d, sub_scale = split(step)
        dmin, sub_min = split(-low)
        scale = (d[:, index] * sub_scale.float()).clamp_min(1e-30)[..., None]  # [N, J, 1]
        codes = ((sub_blocks + (dmin[:, index] * sub_min.float())[..., None]) / scale).round_().clamp_(0, 3)
        return cls.from_blocks(codes.to(torch.uint8).reshape(rows, width), sub_scale, sub_min, d, -dmin)

    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The plain ``(codes, sub_scale, sub_min, d, dmin)`` of :meth:`from_blocks`."""
        codes = unpack_bit_pairs(self.codes).reshape(self.padded_rows, self.in_features)[: self.rows]
        scales = rows_from_pairs(self.scales, self.rows)
        return codes, scales & 0x0F, scales >> 4, rows_first(self.d, self.rows), rows_first(self.dmin, self.rows)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q2_matmul(rows, self.codes, self.scales, self.d, self.dmin, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        return superblock_reference(rows, *self.blocks(), SUB_BLOCK, SUBS_PER_SUPER)

    @staticmethod
    def affine(
        codes: torch.Tensor, sub_scale: torch.Tensor, sub_min: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor
    ) -> Affine:
        return superblock_affine(codes, sub_scale, sub_min, d, dmin, SUB_BLOCK, SUBS_PER_SUPER)

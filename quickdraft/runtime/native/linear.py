"""Linear layers whose rows never mix: exact integer GEMMs on per-row 8-bit activations (``gemm.h``).

Activations are quantized per row: each row x gets its own scale s = max|x| / 127 and becomes integers in
[−127, 127]. A layer of two passes (``passes = 2``, a model's ``DecoderConfig.activation_passes``) quantizes
what the first pass left, x − round(x / s)·s, the same way, as rows of their own after the first pass's; each
pass's GEMM output is scaled by its own s and the passes are added in order. The weights come in parts (ranges
of output rows), each in one of two formats; a part's integer products are summed exactly (int32) and then
finished by a fixed sequence of float operations, so a row's result never depends on the other rows of the
call, the tile or thread it lands in, or the instruction set:

- ``int8``: 7-bit weights per output channel (symmetric, scale = row max / 63): out = float(Σ x·w) · scale.
  7 bits keep AVX2's u8 × s8 pair sums below 2^15, so the same weights serve every instruction set.
- ``q4``: llama.cpp's Q4_K structure: 4-bit codes in groups of 32, each group with an 8-bit sub-scale and
  sub-min under float superblock scales (d, dmin) per 8 groups: w = d · sub_scale · code + dmin · sub_min.
  A GGUF file's Q4_K tensors load into it exactly, with no second quantization (``gguf_blocks.py``).

The layer's result is out · s, summed over the passes (+ bias). The PyTorch path
(:meth:`QuantizedLinear.reference`, used where the kernels cannot be compiled and as the tests' oracle) performs
the same float operations in the same order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from quickdraft.runtime.native.kernels import native_kernels

WEIGHT_LEVELS = 63.0  # 7-bit int8 weights: |w| <= 63 keeps AVX2's u8 x s8 pair sums below 2^15
ACTIVATION_LEVELS = 127.0  # 8-bit activations per row
LANES = 16  # outputs per block of the packed layouts (one 512-bit vector)
GROUP = 32  # q4: weights per group
GROUPS_PER_SUPER = 8  # q4: groups per superblock
INT8_OFFSET = 64  # int8 codes hold w + 64


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (int8 ``[N, K]`` in [−63, 63], float32 scale ``[N]``), symmetric per output channel."""
    weight = weight.float()
    scale = (weight.abs().amax(dim=1) / WEIGHT_LEVELS).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scale[:, None]).clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS).to(torch.int8), scale


def quantize_rows(x: torch.Tensor, passes: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, K]`` float -> (integers in [−127, 127] as float ``[P·M, K]``, row scales ``[P·M, 1]``) in P = ``passes``
    passes, each quantizing what the ones before left: the kernels' rule."""
    if passes not in (1, 2):
        raise ValueError(f"activations are quantized in 1 or 2 passes, not {passes}")
    row_scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / ACTIVATION_LEVELS  # [M, 1]
    rows = torch.round(x / row_scale).clamp_(-ACTIVATION_LEVELS, ACTIVATION_LEVELS)  # [M, K]
    if passes == 1:
        return rows, row_scale
    residual_rows, residual_scale = quantize_rows(x - rows * row_scale)
    return torch.cat([rows, residual_rows]), torch.cat([row_scale, residual_scale])


def combine_passes(out: torch.Tensor, row_scale: torch.Tensor, passes: int) -> torch.Tensor:
    """A GEMM's output over ``passes`` passes of M rows, ``out [P·M, N]`` with ``row_scale [P·M, 1]`` -> ``[M, N]``:
    each pass times its scale, added in pass order (the kernels' ``combine_rows`` without the bias)."""
    rows = out.shape[0] // passes
    y = out[:rows] * row_scale[:rows]
    for start in range(rows, passes * rows, max(rows, 1)):  # no rows: no passes to add
        y = y + out[start : start + rows] * row_scale[start : start + rows]
    return y


def padded(rows: int) -> int:
    return -(-rows // LANES) * LANES


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` (the packed layouts hold whole blocks of 16 outputs)."""
    extra = rows - tensor.shape[0]
    return tensor if extra == 0 else torch.cat([tensor, tensor.new_zeros(extra, *tensor.shape[1:])])


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
        groups, supers, blocks = width // GROUP, -(-width // (GROUP * GROUPS_PER_SUPER)), padded(rows) // LANES
        codes = pad_rows(codes.to(torch.uint8), padded(rows)).reshape(blocks, LANES, groups, 8, 4)
        packed = (codes[:, :, :, :4] | (codes[:, :, :, 4:] << 4)).permute(0, 2, 3, 1, 4)  # [N/16, G, 4, 16, 4]

        def lanes_last(t: torch.Tensor, per_row: int) -> torch.Tensor:  # [N, per_row] -> [N/16, per_row, 16]
            return pad_rows(t, padded(rows)).reshape(blocks, LANES, per_row).permute(0, 2, 1)

        return cls(
            rows,
            codes=packed,
            sub_scale=lanes_last(sub_scale.to(torch.uint8), groups),
            sub_min=pad_rows(sub_min.to(torch.uint8), padded(rows)).reshape(blocks, LANES, -1, 2).transpose(1, 2),
            d=lanes_last(d.float(), supers),
            dmin=lanes_last(dmin.float(), supers),
        )

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q4Part:
        """Round-to-nearest 4-bit quantization of float weights into the Q4_K structure (for models that come
        without it; a GGUF file's own Q4_K blocks are loaded exactly instead)."""
        rows, width = weight.shape
        groups = weight.float().reshape(rows, width // GROUP, GROUP)
        low = groups.amin(dim=-1).clamp(max=0.0)  # like llama.cpp: the offset is never positive
        step = (groups.amax(dim=-1) - low).clamp_min(1e-30) / 15  # [N, G]
        supers = -(-(width // GROUP) // GROUPS_PER_SUPER)

        def split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [N, G] -> ([N, S], u8 [N, G])
            padded_values = torch.nn.functional.pad(values, (0, supers * GROUPS_PER_SUPER - values.shape[1]))
            top = padded_values.reshape(rows, supers, GROUPS_PER_SUPER).amax(-1).clamp_min(1e-30) / 255  # [N, S]
            index = torch.arange(values.shape[1]) // GROUPS_PER_SUPER
            return top, torch.round(values / top[:, index]).clamp_(0, 255).to(torch.uint8)

        d, sub_scale = split(step)
        dmin_magnitude, sub_min = split(-low)
        index = torch.arange(width // GROUP) // GROUPS_PER_SUPER
        scale = (d[:, index] * sub_scale.float()).clamp_min(1e-30)[..., None]  # the step after rounding [N, G, 1]
        offset = (-dmin_magnitude[:, index] * sub_min.float())[..., None]
        codes = torch.round((groups - offset) / scale).clamp_(0, 15).to(torch.uint8).reshape(rows, width)
        return cls.from_blocks(codes, sub_scale, sub_min, d, -dmin_magnitude)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.tensor_names}

    @classmethod
    def from_tensors(cls, rows: int, tensors: dict[str, torch.Tensor]) -> Q4Part:
        return cls(rows, **tensors)

    def blocks(self) -> tuple[torch.Tensor, ...]:
        """The plain ``(codes, sub_scale, sub_min, d, dmin)`` of :meth:`from_blocks`."""
        blocks, groups = self.codes.shape[:2]
        packed = self.codes.permute(0, 3, 1, 2, 4)  # [N/16, 16, G, 4, 4]
        codes = torch.cat([packed & 0x0F, packed >> 4], dim=3).reshape(blocks * LANES, groups * GROUP)

        def rows_first(t: torch.Tensor) -> torch.Tensor:  # [N/16, X, 16] -> [rows, X]
            return t.permute(0, 2, 1).reshape(blocks * LANES, -1)[: self.rows]

        sub_min = self.sub_min.transpose(1, 2).reshape(blocks * LANES, groups)[: self.rows]
        return codes[: self.rows], rows_first(self.sub_scale), sub_min, rows_first(self.d), rows_first(self.dmin)

    def matmul_into(self, kernels: Any, rows: torch.Tensor, out: torch.Tensor, column: int) -> None:
        kernels.q4_matmul(rows, self.codes, self.sub_scale, self.sub_min, self.d, self.dmin, out, column)

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        codes, sub_scale, sub_min, d, dmin = self.blocks()
        groups = self.in_features // GROUP
        x = rows.double().reshape(rows.shape[0], groups, GROUP)  # [M, G, 32]
        dots = torch.einsum("mgk,ngk->mng", x, codes.double().reshape(self.rows, groups, GROUP)).float()  # exact
        sums = x.sum(-1)  # [M, G] exact
        acc = torch.zeros(rows.shape[0], self.rows)
        for first in range(0, groups, GROUPS_PER_SUPER):
            s = first // GROUPS_PER_SUPER
            span = range(first, min(first + GROUPS_PER_SUPER, groups))
            for g in span:
                acc = acc + (d[:, s] * sub_scale[:, g].float()) * dots[:, :, g]
            offset = sum(sums[:, g, None] * sub_min[:, g].double() for g in span)  # integers: exact
            acc = acc + dmin[:, s] * offset.float()
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


PART_KINDS: dict[str, type[WeightPart]] = {part.kind: part for part in (Int8Part, Q4Part)}


class QuantizedLinear:
    """``y = x @ W.T + b`` over weight parts (row ranges of W in their own formats), bit-exact per row."""

    def __init__(self, parts: list[WeightPart], bias: torch.Tensor | None = None, passes: int = 1) -> None:
        if not parts or len({part.in_features for part in parts}) != 1:
            raise ValueError("a linear layer needs parts of one input width")
        self.parts = parts
        self.passes = passes  # 8-bit passes over each input row (quantize_rows)
        self.in_features = parts[0].in_features
        self.out_features = sum(part.rows for part in parts)
        self.bias = None if bias is None else bias.float().contiguous()
        self.kernel_bias = self.bias if self.bias is not None else torch.empty(0)  # the kernels' "no bias"
        self.use_kernel = True  # the compiled kernels when they build (False: PyTorch operations)
        columns = [0]
        for part in parts:
            columns.append(columns[-1] + part.padded_rows)
        self.columns = columns[:-1]  # where each part's outputs start in the padded GEMM output
        self.padded_width = columns[-1]
        real = [torch.arange(column, column + part.rows) for column, part in zip(self.columns, parts, strict=True)]
        self.real_columns = None if self.padded_width == self.out_features else torch.cat(real)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, kind: str = "int8") -> QuantizedLinear:
        return cls([PART_KINDS[kind].from_float(weight)], bias)

    def select_rows(self, index: torch.Tensor) -> QuantizedLinear:
        """The layer restricted to the output rows ``index`` (sorted, distinct), e.g. an LM head over part of a
        vocabulary; each row keeps its weights and its bits."""
        parts, start = [], 0
        for part in self.parts:
            inside = index[(index >= start) & (index < start + part.rows)] - start
            if len(inside):
                parts.append(part.select_rows(inside))
            start += part.rows
        return QuantizedLinear(parts, None if self.bias is None else self.bias[index], self.passes)

    def matmul_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The compiled GEMMs: int8 ``rows [M, K]`` -> ``[M, N]`` before the row scale and the bias (the
        native kernels fuse those into the next step)."""
        kernels = native_kernels()
        out = torch.empty(rows.shape[0], self.padded_width)
        for part, column in zip(self.parts, self.columns, strict=True):
            part.matmul_into(kernels, rows, out, column)
        return out if self.real_columns is None else out[:, self.real_columns]

    def kernel_spec(self, kernels: Any) -> Any:
        """This layer as the compiled layer loop takes it (``layers.cpp``'s Linear; parts by kind number)."""
        parts = [
            kernels.Part(part.kernel_kind, column, list(part.tensors().values()))
            for part, column in zip(self.parts, self.columns, strict=True)
        ]
        columns = torch.empty(0, dtype=torch.long) if self.real_columns is None else self.real_columns
        return kernels.Linear(parts, self.padded_width, columns, self.kernel_bias)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """PyTorch operations, the same arithmetic: float ``x [M, K]`` -> ``[M, N]``."""
        rows, row_scale = quantize_rows(x, self.passes)  # [P·M, K], [P·M, 1]
        out = torch.cat([part.reference(rows) for part in self.parts], dim=1)  # [P·M, N]
        y = combine_passes(out, row_scale, self.passes)  # [M, N]
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).float()  # [M, K]
        if self.use_kernel and (kernels := native_kernels()) is not None:  # the same arithmetic, fused
            rows, row_scale = kernels.quantize_rows(x, self.passes)  # int8 [P·M, K], [P·M, 1]
            y = kernels.combine_rows(self.matmul_rows(rows), row_scale, self.kernel_bias, self.passes)
        else:
            y = self.reference(x)
        return y.reshape(*shape[:-1], self.out_features)

    def state(self, name: str) -> dict[str, torch.Tensor]:
        """Tensors for the native weight cache: ``NAME.I.KIND.TENSOR`` per part, ``NAME.I.KIND.rows``, ``NAME.bias``."""
        state = {} if self.bias is None else {f"{name}.bias": self.bias}
        for index, part in enumerate(self.parts):
            prefix = f"{name}.{index}.{part.kind}"
            state[f"{prefix}.rows"] = torch.tensor(part.rows)
            state.update({f"{prefix}.{key}": tensor for key, tensor in part.tensors().items()})
        return state

    @classmethod
    def from_state(cls, name: str, state: dict[str, torch.Tensor], passes: int = 1) -> QuantizedLinear:
        kinds = {}  # part index -> kind, from the NAME.I.KIND.rows keys
        for key in state:
            if key.startswith(f"{name}.") and key.endswith(".rows"):
                index, kind = key[len(name) + 1 : -len(".rows")].split(".")
                kinds[int(index)] = kind
        parts = []
        for index in sorted(kinds):
            prefix, part = f"{name}.{index}.{kinds[index]}", PART_KINDS[kinds[index]]
            tensors = {key: state[f"{prefix}.{key}"] for key in part.tensor_names}
            parts.append(part.from_tensors(int(state[f"{prefix}.rows"]), tensors))
        return cls(parts, state.get(f"{name}.bias"), passes)

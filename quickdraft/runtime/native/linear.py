"""Linear layers whose rows never mix: exact integer GEMMs on per-row 8-bit activations.

Activations are quantized per row: each row x gets its own scale s = max|x| / 127 and becomes integers in
[−127, 127]. A layer of two passes (``passes = 2``, a model's ``DecoderConfig.activation_passes``) quantizes
what the first pass left, x − round(x / s)·s, the same way, as rows of their own after the first pass's; each
pass's GEMM output is scaled by its own s and the passes are added in order. The weights come in parts (ranges
of output rows, each in one of ``parts.py``'s formats); a part's result never depends on the other rows of the
call, the tile or thread it lands in, or the instruction set.

The layer's result is out · s, summed over the passes (+ bias). The PyTorch path
(:meth:`QuantizedLinear.reference`, used where the kernels cannot be compiled and as the tests' oracle) performs
the same float operations in the same order.
"""

from __future__ import annotations

from typing import Any

import torch

from quickdraft.runtime.native.formats import PART_KINDS
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.parts import WeightPart

ACTIVATION_LEVELS = 127.0  # 8-bit activations per row


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

    def dequantize(self) -> torch.Tensor:
        """The float weights the parts hold, ``[N, K]``."""
        return torch.cat([part.dequantize() for part in self.parts])

    def kernel_spec(self, kernels: Any) -> Any:
        """This layer as the compiled layer loop takes it (``layers.h``'s Linear; parts by kind number)."""
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

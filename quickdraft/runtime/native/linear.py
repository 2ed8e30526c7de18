"""Row-invariant int8 linear layers on fbgemm: exact integer arithmetic, so a row's result never
depends on the other rows in the call.

Weights are quantized per output channel (symmetric int8, scale = row max / 127). Activations
are quantized per row by us, not by the kernel: each row x is divided by its own scale
s = max|x| / (2^(bits−1) − 1) and rounded to integers. fbgemm's dynamic int8 GEMM then runs
on those integers with its per-tensor quantization pinned to scale 1 and zero point 64 by a
sentinel row holding −64 and 63, so its quantization step is the identity and its int32
accumulation is exact: no 16-bit saturation can happen with 7-bit inputs (two products of
at most 127·128 each sum to less than 2^15). The float result is acc·w_scale, then ·s.

``activation_bits=7`` quantizes a row to [−64, 63]. ``activation_bits=14`` splits the 14-bit
integer into a high and a low 7-bit half, x = 128·hi + lo + 64, and runs both halves as rows of
the same GEMM (the weights are read once): y = 128·(hi·W) + lo·W + 64·colsum(W).
"""

from __future__ import annotations

import warnings

import torch

from quickdraft.runtime.native.kernels import native_kernels

SENTINEL_LOW, SENTINEL_HIGH = -64.0, 63.0


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (int8 ``[N, K]``, float32 scale ``[N]``), symmetric per output channel."""
    weight = weight.float()
    scale = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


class Int8Linear:
    """``y = x @ W.T + b`` with int8 weights and per-row quantized activations, bit-exact per row."""

    def __init__(self, weight_int8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 activation_bits: int = 14) -> None:  # fmt: skip
        if activation_bits not in (7, 14):
            raise ValueError(f"activation_bits must be 7 or 14, got {activation_bits}")
        self.out_features, self.in_features = weight_int8.shape
        self.activation_bits = activation_bits
        self.bias = None if bias is None else bias.float().contiguous()
        self.weight_scale = weight_scale.float().contiguous()  # [N]
        # 64·colsum(W)·w_scale: the offset of the low half in the 14-bit split, [N]
        self.low_offset = (64.0 * weight_int8.sum(dim=1, dtype=torch.int64).double() * weight_scale.double()).float()
        with warnings.catch_warnings():  # quantized tensor constructors are deprecated in torch 2.13, not removed
            warnings.simplefilter("ignore")
            quantized = torch._make_per_channel_quantized_tensor(
                weight_int8, weight_scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0
            )
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self.use_kernel = True  # the compiled quantize/combine kernels when they build (False: PyTorch ops)
        self._sentinel = torch.zeros(1, self.in_features)  # pins fbgemm's per-tensor range to [−64, 63]
        self._sentinel[0, :2] = torch.tensor([SENTINEL_LOW, SENTINEL_HIGH])

    @classmethod
    def from_float(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, activation_bits: int = 14
    ) -> Int8Linear:
        weight_int8, scale = quantize_weight(weight)
        return cls(weight_int8, scale, bias, activation_bits)

    def _integer_matmul(self, x_int: torch.Tensor) -> torch.Tensor:
        """Rows of integers in [−64, 63] -> float(x_int @ W_int.T)·w_scale, exactly per row."""
        rows = torch.cat([x_int, self._sentinel])  # [M + 1, K]
        return torch.ops.quantized.linear_dynamic(rows, self.packed, True)[:-1]  # [M, N]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).float()  # [M, K]
        if self.use_kernel and (kernels := native_kernels()) is not None:  # the same arithmetic, fused
            rows, row_scale = kernels.quantize_rows(x, self.activation_bits)  # [M+1 or 2M+1, K], [M, 1]
            out = torch.ops.quantized.linear_dynamic(rows, self.packed, True)  # [.., N]
            bias = self.bias if self.bias is not None else torch.empty(0)
            y = kernels.combine_rows(out, row_scale, self.low_offset, bias, self.activation_bits)
            return y.reshape(*shape[:-1], self.out_features)
        levels = 2.0 ** (self.activation_bits - 1) - 1.0  # 63 or 8191
        row_scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / levels  # [M, 1]
        x_int = torch.round(x / row_scale).clamp_(-levels - 1.0, levels)  # [M, K]
        if self.activation_bits == 7:
            y = self._integer_matmul(x_int)
        else:
            high = torch.floor(x_int / 128.0)  # [M, K] in [−64, 63]
            low = x_int - 128.0 * high - 64.0  # [M, K] in [−64, 63]
            both = self._integer_matmul(torch.cat([high, low]))  # [2M, N]
            rows = x_int.shape[0]
            y = 128.0 * both[:rows] + both[rows:] + self.low_offset
        y = y * row_scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

"""Row-invariant int8 linear layers on fbgemm: exact integer arithmetic, so a row's result never
depends on the other rows in the call, and one GEMM row per token.

Weights are quantized per output channel to 7 bits (symmetric, scale = row max / 63).
Activations are quantized per row by us, not by the kernel: each row x is divided by its own
scale s = max|x| / 127 and rounded to integers in [−127, 127]. fbgemm's dynamic int8 GEMM then
runs on those integers with its per-tensor quantization pinned to scale 1 and zero point 128 by
a sentinel row holding −128 and 127, so its quantization step is the identity (x + 128, an
unsigned byte). Its int32 accumulation is exact: AVX2's 16-bit pair sums cannot saturate,
since two products of at most 255·64 sum to less than 2^15 — which is why weights get 7 bits
and activations 8. The float result is acc·w_scale, then ·s (+ bias).

Measured on the default 1.5B target (2 cores, AVX2): the earlier 14-bit activation split (two
GEMM rows per token, 8-bit weights) cost 1.4–1.7× more at 6–16 tokens per forward for the same
perplexity within ±3 % on five Spec-Bench prompts (see docs/design.md).
"""

from __future__ import annotations

import warnings

import torch

from quickdraft.runtime.native.kernels import native_kernels

WEIGHT_LEVELS = 63.0  # 7-bit weights: |w| <= 63 keeps fbgemm's u8 x s8 pair sums below 2^15
ACTIVATION_LEVELS = 127.0  # 8-bit activations per row
SENTINEL_LOW, SENTINEL_HIGH = -128.0, 127.0


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (int8 ``[N, K]`` in [−63, 63], float32 scale ``[N]``), symmetric per output channel."""
    weight = weight.float()
    scale = (weight.abs().amax(dim=1) / WEIGHT_LEVELS).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scale[:, None]).clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS).to(torch.int8), scale


class Int8Linear:
    """``y = x @ W.T + b`` with 7-bit weights and per-row 8-bit activations, bit-exact per row."""

    def __init__(self, weight_int8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        low, high = torch.aminmax(weight_int8)  # not abs(): int8 abs(-128) stays -128
        if int(low) < -WEIGHT_LEVELS or int(high) > WEIGHT_LEVELS:
            raise ValueError("weights must be quantized to [-63, 63] (quantize_weight)")
        self.out_features, self.in_features = weight_int8.shape
        self.bias = None if bias is None else bias.float().contiguous()
        self.kernel_bias = self.bias if self.bias is not None else torch.empty(0)  # the kernels' "no bias"
        with warnings.catch_warnings():  # quantized tensor constructors are deprecated in torch 2.13, not removed
            warnings.simplefilter("ignore")
            quantized = torch._make_per_channel_quantized_tensor(
                weight_int8, weight_scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0
            )
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self.use_kernel = True  # the compiled quantize/combine kernels when they build (False: PyTorch ops)
        self._sentinel = torch.zeros(1, self.in_features)  # pins fbgemm's per-tensor range to [−128, 127]
        self._sentinel[0, :2] = torch.tensor([SENTINEL_LOW, SENTINEL_HIGH])

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        weight_int8, scale = quantize_weight(weight)
        return cls(weight_int8, scale, bias)

    def matmul_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The exact integer GEMM: quantized rows ``[M + 1, K]`` (the sentinel last) -> ``[M + 1, N]``, before
        the activation scale and the bias (the native kernels fuse those into the next step)."""
        return torch.ops.quantized.linear_dynamic(rows, self.packed, False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).float()  # [M, K]
        if self.use_kernel and (kernels := native_kernels()) is not None:  # the same arithmetic, fused
            rows, row_scale = kernels.quantize_rows(x)  # [M + 1, K] with the sentinel last, [M, 1]
            out = self.matmul_rows(rows)  # [M + 1, N]
            return kernels.combine_rows(out, row_scale, self.kernel_bias).reshape(*shape[:-1], self.out_features)
        row_scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / ACTIVATION_LEVELS  # [M, 1]
        x_int = torch.round(x / row_scale).clamp_(-ACTIVATION_LEVELS, ACTIVATION_LEVELS)  # [M, K]
        rows = torch.cat([x_int, self._sentinel])  # [M + 1, K]
        y = self.matmul_rows(rows)[:-1] * row_scale  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

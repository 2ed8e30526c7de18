"""Float32 operations with the rounding of the C++ kernels, for the PyTorch reference paths.

``fused_multiply_add`` is ``std::fma`` on float32: a · b + c rounded once. PyTorch has no such operation on
the CPU, so it is computed in float64, where a · b is exact, with the sum rounded to odd: a float64 result whose
last bit is set whenever the sum was inexact. Rounding that to float32 gives the correctly rounded sum, because
float64 carries more than two bits beyond float32's 24 (Boldo and Melquiond, "Emulation of FMA and correctly
rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
"""

from __future__ import annotations

import torch


def fused_multiply_add(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 ``a · b + c`` rounded once (broadcasting as ``*`` and ``+`` do)."""
    product = a.double() * b.double()  # exact: 24 + 24 significant bits
    addend = c.double()
    total = product + addend  # rounded to nearest
    # TwoSum: total + error == product + addend exactly
    virtual = total - product
    error = (product - (total - virtual)) + (addend - virtual)
    even = (total.view(torch.int64) & 1) == 0
    toward = torch.where(error > 0, torch.full_like(total, float("inf")), torch.full_like(total, float("-inf")))
    rounded_to_odd = torch.where((error != 0) & even, torch.nextafter(total, toward), total)
    return rounded_to_odd.float()

"""C++ kernels of the native runtime, compiled once on first use (needs a C++ compiler and ninja).

If compilation fails the runtime falls back to the same algorithm in PyTorch operations: still
bit-stable, only slower. A warning says so.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

FLAGS = ["-O3", "-march=native", "-ffp-contract=off"]  # no fused multiply-add: the same bits on every path


@functools.cache
def attention_kernel() -> Any | None:
    """The compiled ``attend`` module, or None when it cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        return load(
            name="quickdraft_attention",
            sources=[str(Path(__file__).with_name("attention.cpp"))],
            extra_cflags=FLAGS,
            verbose=False,
        )
    except Exception as error:  # a missing compiler or ninja surfaces as many exception types
        warnings.warn(
            f"quickdraft: the native attention kernel could not be compiled ({type(error).__name__}: {error}); "
            f"using the slower PyTorch path",
            stacklevel=2,
        )
        return None

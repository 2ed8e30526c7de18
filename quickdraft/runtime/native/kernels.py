"""C++ kernels of the native runtime, compiled once on first use (needs a C++ compiler and ninja).

If compilation fails the runtime falls back to the same algorithm in PyTorch operations: still
bit-stable, only slower. A warning says so.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

from quickdraft.machine import cpu_fingerprint

FLAGS = ["-O3", "-march=native", "-ffp-contract=off"]  # no fused multiply-add: the same bits on every path


@functools.cache
def native_kernels() -> Any | None:
    """The compiled module (``attend``, ``quantize_rows``, ``combine_rows``), or None when it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        return load(  # -march=native: a build per processor kind, never one compiled for another CPU
            name=f"quickdraft_native_{cpu_fingerprint()}",
            sources=[str(Path(__file__).with_name("kernels.cpp"))],
            extra_cflags=FLAGS,
            verbose=False,
        )
    except Exception as error:  # a missing compiler or ninja surfaces as many exception types
        warnings.warn(
            f"quickdraft: the native runtime's kernels could not be compiled ({type(error).__name__}: {error}); "
            f"using the slower PyTorch path",
            stacklevel=2,
        )
        return None

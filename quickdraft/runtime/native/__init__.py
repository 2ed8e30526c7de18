"""The native CPU runtime: int8 weights, exact row-invariant kernels, a static KV cache (imported on first use, so
that the package's light modules, such as ``architecture``, import without torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quickdraft.lazy import lazy_exports

if TYPE_CHECKING:
    from quickdraft.runtime.native.runtime import NativeCache, NativeRuntime

__getattr__, __dir__ = lazy_exports(
    __name__,
    {"NativeCache": "quickdraft.runtime.native.runtime", "NativeRuntime": "quickdraft.runtime.native.runtime"},
)

__all__ = ["NativeCache", "NativeRuntime"]

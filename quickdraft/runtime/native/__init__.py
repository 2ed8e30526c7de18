"""The native CPU runtime: int8 weights, exact row-invariant kernels, a static KV cache."""

from quickdraft.runtime.native.runtime import NativeCache, NativeRuntime

__all__ = ["NativeCache", "NativeRuntime"]

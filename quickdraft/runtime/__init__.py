"""Runtimes by name: ``RUNTIMES.get(name).load(path)``; ``runtime_for("auto", path)`` picks one.

The registry names each runtime by the module defining it, and the classes below are imported on first use, so a
command's parser lists the runtimes without importing torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quickdraft.errors import ConfigError, UnknownNameError
from quickdraft.lazy import lazy_exports
from quickdraft.registry import Registry
from quickdraft.runtime.names import AUTO

if TYPE_CHECKING:
    import torch

    from quickdraft.runtime.base import BatchRow, KVCache, LoadOptions, Runtime
    from quickdraft.runtime.hf import HFRuntime
    from quickdraft.runtime.native import NativeRuntime

RUNTIMES: Registry[type[Runtime]] = Registry(
    "runtime",
    setting="runtime",
    lazy={
        "transformers": "quickdraft.runtime.hf:HFRuntime",
        "native": "quickdraft.runtime.native.runtime:NativeRuntime",
    },
)


def check_runtime(name: str) -> None:
    """``name`` is ``auto`` or a registered runtime; else an error that lists them all."""
    if name != AUTO and name not in RUNTIMES.names():
        raise UnknownNameError(f"unknown runtime {name!r}; choose one of: {AUTO}, {', '.join(RUNTIMES.names())}")


def runtime_for(name: str, path: Path, device: torch.device | None = None) -> type[Runtime]:
    """The runtime class called ``name``; ``auto`` = on the CPU (the default ``device``) native for the families it
    implements, else transformers; on a GPU transformers, the one runtime that runs there."""
    from quickdraft.runtime.hf import HFRuntime
    from quickdraft.runtime.native import NativeRuntime

    check_runtime(name)
    runtime = RUNTIMES.get(name) if name != AUTO else None
    if device is not None and device.type != "cpu":
        if runtime is not None and runtime is not HFRuntime:
            raise ConfigError(f"the {name} runtime runs on the CPU only; on {device} use the transformers runtime")
        return HFRuntime
    if runtime is None:
        return NativeRuntime if NativeRuntime.supports(path) else HFRuntime
    return runtime


__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BatchRow": "quickdraft.runtime.base",
        "HFRuntime": "quickdraft.runtime.hf",
        "KVCache": "quickdraft.runtime.base",
        "LoadOptions": "quickdraft.runtime.base",
        "NativeRuntime": "quickdraft.runtime.native",
        "Runtime": "quickdraft.runtime.base",
    },
)

__all__ = [
    "AUTO",
    "RUNTIMES",
    "BatchRow",
    "HFRuntime",
    "KVCache",
    "LoadOptions",
    "NativeRuntime",
    "Runtime",
    "runtime_for",
]

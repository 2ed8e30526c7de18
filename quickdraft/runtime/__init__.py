"""Runtimes by name: ``RUNTIMES.get(name).load(path)``; ``runtime_for("auto", path)`` picks one."""

from pathlib import Path

from quickdraft.registry import Registry
from quickdraft.runtime.base import BatchRow, KVCache, LoadOptions, Runtime
from quickdraft.runtime.hf import HFRuntime
from quickdraft.runtime.native import NativeRuntime

RUNTIMES: Registry[type[Runtime]] = Registry("runtime")
RUNTIMES.register(HFRuntime.name)(HFRuntime)
RUNTIMES.register(NativeRuntime.name)(NativeRuntime)
AUTO = "auto"


def runtime_for(name: str, path: Path) -> type[Runtime]:
    """The runtime class called ``name``; ``auto`` = native for the families it implements, else transformers."""
    if name == AUTO:
        return NativeRuntime if NativeRuntime.supports(path) else HFRuntime
    return RUNTIMES.get(name)


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

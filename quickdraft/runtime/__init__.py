"""Runtimes by name: ``RUNTIMES.get(name).load(path)``; ``runtime_for("auto", path)`` picks one."""

from pathlib import Path

import torch

from quickdraft.errors import ConfigError
from quickdraft.registry import Registry
from quickdraft.runtime.base import BatchRow, KVCache, LoadOptions, Runtime
from quickdraft.runtime.device import CPU
from quickdraft.runtime.hf import HFRuntime
from quickdraft.runtime.native import NativeRuntime

RUNTIMES: Registry[type[Runtime]] = Registry("runtime")
RUNTIMES.register(HFRuntime.name)(HFRuntime)
RUNTIMES.register(NativeRuntime.name)(NativeRuntime)
AUTO = "auto"


def runtime_for(name: str, path: Path, device: torch.device = CPU) -> type[Runtime]:
    """The runtime class called ``name``; ``auto`` = on the CPU native for the families it implements, else
    transformers; on a GPU transformers, the one runtime that runs there."""
    runtime = RUNTIMES.get(name) if name != AUTO else None
    if device.type != "cpu":
        if runtime is not None and runtime is not HFRuntime:
            raise ConfigError(f"the {name} runtime runs on the CPU only; on {device} use the transformers runtime")
        return HFRuntime
    if runtime is None:
        return NativeRuntime if NativeRuntime.supports(path) else HFRuntime
    return runtime


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

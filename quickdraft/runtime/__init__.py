"""Runtimes by name: ``RUNTIMES.get(name).load(path)``."""

from quickdraft.registry import Registry
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.runtime.hf import HFRuntime
from quickdraft.runtime.native import NativeRuntime

RUNTIMES: Registry[type[Runtime]] = Registry("runtime")
RUNTIMES.register("transformers")(HFRuntime)
RUNTIMES.register("native")(NativeRuntime)

__all__ = ["RUNTIMES", "HFRuntime", "KVCache", "NativeRuntime", "Runtime"]

"""One registry maps names to drafters and runtimes.

Classes register themselves under a name; callers look them up by that name. Unknown
names raise :class:`UnknownNameError` listing what is available, so a CLI typo gets a
clear message instead of a KeyError traceback.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from quickdraft.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries registered (``register``) or named by where they are defined (``lazy``: name -> "module:attribute",
    imported by ``get``), so that listing the names imports nothing."""

    def __init__(self, kind: str, lazy: Mapping[str, str] | None = None, setting: str | None = None) -> None:
        self.kind = kind
        self.setting = setting  # the library setting that names an entry: an unknown name's error names it
        self._entries: dict[str, T] = {}
        self._lazy = dict(lazy or {})

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            if name in self._entries or name in self._lazy:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        if not isinstance(name, str):  # a list or dict is no name (and could not be looked up)
            known = ", ".join(self.names())
            raise UnknownNameError(
                f"a {self.kind} is named by text, got {name!r}; choose one of: {known}", self.setting
            )
        if name in self._lazy:
            module, attribute = self._lazy[name].split(":")
            return getattr(importlib.import_module(module), attribute)
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names())
            raise UnknownNameError(f"unknown {self.kind} {name!r}; choose one of: {known}", self.setting) from None

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._lazy})

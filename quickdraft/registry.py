"""One registry maps names to drafters and runtimes.

Classes register themselves under a name; callers look them up by that name. Unknown
names raise :class:`UnknownNameError` listing what is available, so a CLI typo gets a
clear message instead of a KeyError traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from quickdraft.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names())
            raise UnknownNameError(f"unknown {self.kind} {name!r}; choose one of: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

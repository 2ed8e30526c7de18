"""``quickdraft serve``: an OpenAI-compatible HTTP server over the batched engine (FastAPI, uvicorn).

The app is ``quickdraft.server.app.create_app``; this package imports no web framework itself, so the commands
that serve nothing run without one, and nothing at all until a name below is used (``serve --help`` reads
``server.access``'s limits without torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quickdraft.lazy import lazy_exports

if TYPE_CHECKING:
    from quickdraft.server.protocol import ApiError, ServerDefaults

__getattr__, __dir__ = lazy_exports(
    __name__, {"ApiError": "quickdraft.server.protocol", "ServerDefaults": "quickdraft.server.protocol"}
)

__all__ = ["ApiError", "ServerDefaults"]

"""``quickdraft serve``: an OpenAI-compatible HTTP server over the batched engine (FastAPI, uvicorn).

The app is ``quickdraft.server.app.create_app``; this package imports no web framework itself, so the commands
that serve nothing run without one."""

from quickdraft.server.protocol import ApiError, ServerDefaults

__all__ = ["ApiError", "ServerDefaults"]

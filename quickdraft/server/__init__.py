"""``quickdraft serve``: an OpenAI-compatible HTTP server over the batched engine (FastAPI, uvicorn)."""

from quickdraft.server.app import create_app
from quickdraft.server.protocol import ApiError, ServerDefaults

__all__ = ["ApiError", "ServerDefaults", "create_app"]

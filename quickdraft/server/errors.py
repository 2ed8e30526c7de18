"""The error a client sees: an HTTP status and OpenAI's error body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quickdraft.engine import RequestFailed

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/tokenize", "/detokenize",
             "/health", "/metrics")  # fmt: skip  # named in the 404 of any other path


class ApiError(Exception):
    """A request the server refuses: HTTP ``status`` with an OpenAI-style error body, and ``headers`` of its own (a
    429's ``retry-after``)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def failure(event: RequestFailed) -> ApiError:
    """The error of a request the engine could not finish: the request's own fault is a 400, a server that stopped
    before it finished a 503 (send it again), anything else the server's fault (500)."""
    from quickdraft.engine import FailureCause  # the engine imports torch; serve --help reads this module

    if event.cause is FailureCause.REQUEST:
        return ApiError(400, event.message)
    if event.cause is FailureCause.STOPPING:
        return shutting_down(event.message)
    return ApiError(500, event.message, kind="server_error")


def shutting_down(message: str = "the server is shutting down") -> ApiError:
    """The 503 of a server that drains: it takes no more requests (a load balancer sends them elsewhere)."""
    return ApiError(503, message, kind="server_error", code="shutting_down")


def no_endpoint(path: str) -> ApiError:
    """The 404 of a path this server does not serve, naming those it does (:data:`ENDPOINTS`)."""
    return ApiError(404, f"this server has no endpoint {path}; it serves {', '.join(ENDPOINTS)}")


def add_error_handlers(app: Any) -> None:
    """OpenAI's error body for an :class:`ApiError` and for one Starlette raises itself: a path no route has (an
    embeddings request, a typo) is a 404 naming :data:`ENDPOINTS`, and a 405 keeps its ``Allow``."""
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    async def api_error(_: Any, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    async def http_error(request: Any, error: HTTPException) -> JSONResponse:
        message = str(error.detail)
        if error.status_code == 404 and message == "Not Found":
            message = no_endpoint(request.url.path).message
        body = ApiError(error.status_code, message).body()
        return JSONResponse(body, status_code=error.status_code, headers=error.headers)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(HTTPException, http_error)

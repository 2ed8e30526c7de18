"""The HTTP server under the app: uvicorn, whose answer to a request too malformed to reach the app (a broken request
line or header, headers over its limit) is an OpenAI-style JSON 400, as every other error is, not plain text."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from quickdraft.server.errors import ApiError

if TYPE_CHECKING:
    import uvicorn


def uvicorn_config(app: Any, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for serving ``app`` on ``host:port``: warnings only, malformed requests answered in JSON."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", http=json_errors_protocol())


@functools.cache
def json_errors_protocol() -> type:
    """The HTTP/1.1 protocol uvicorn would pick (httptools where installed, else h11), its 400 for a request it cannot
    parse written as an error body; the connection then closes, as uvicorn's own 400 closes it."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class JsonErrors(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            body = json.dumps(ApiError(400, f"malformed HTTP request: {msg}").body()).encode()
            headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in
                       self.server_state.default_headers]  # fmt: skip
            headers += [
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
                ("connection", "close"),
            ]
            head = "".join(f"{name}: {value}\r\n" for name, value in headers)
            self.transport.write(f"HTTP/1.1 400 Bad Request\r\n{head}\r\n".encode("latin-1") + body)
            self.transport.close()

    return JsonErrors

"""The HTTP server under the app: uvicorn, whose answer to a request too malformed to reach the app (a broken request
line or header) is an OpenAI-style JSON 400, as every other error is, not plain text; a request line and headers over
:data:`MAX_HEAD_BYTES` get a JSON 431 before they are read further (uvicorn's httptools parser keeps them whole
however long, so an endless header could fill the memory before any key is checked)."""

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


MAX_HEAD_BYTES = 64 << 10  # a request's line and headers together (nginx holds 32 kB, h11 16 kB)
LINGER_SECONDS = 2.0  # how long a refused connection's further bytes are read and dropped before it closes


@functools.cache
def json_errors_protocol() -> type:
    """The HTTP/1.1 protocol uvicorn would pick (httptools where installed, else h11, which bounds a request's head
    itself), its answers to a request it will not read written as error bodies; the connection then closes, as
    uvicorn's own 400 closes it, but lingering: the server's side is shut and what the client still sends is dropped
    until it closes or :data:`LINGER_SECONDS` pass, so the client reads the answer (a socket closed with unread
    bytes is reset, and a reset can discard the answer before the client reads it)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class JsonErrors(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        lingering = False  # the error is written; what comes in is dropped until the connection closes

        def send_400_response(self, msg: str) -> None:
            self.send_error(400, "Bad Request", f"malformed HTTP request: {msg}")

        def send_error(self, status: int, reason: str, message: str) -> None:
            body = json.dumps(ApiError(status, message).body()).encode()
            headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in
                       self.server_state.default_headers]  # fmt: skip
            headers += [
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
                ("connection", "close"),
            ]
            head = "".join(f"{name}: {value}\r\n" for name, value in headers)
            self.transport.write(f"HTTP/1.1 {status} {reason}\r\n{head}\r\n".encode("latin-1") + body)
            if not self.transport.can_write_eof():
                self.transport.close()
                return
            cycle = getattr(self, "cycle", None)  # a request read before this one, still running: its client is gone
            if cycle is not None and not cycle.response_complete:  # as uvicorn's connection_lost tells it
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.write_eof()
            self.lingering = True
            self.loop.call_later(LINGER_SECONDS, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if not self.lingering:
                super().data_received(data)

        def eof_received(self) -> bool | None:
            return None if self.lingering else super().eof_received()  # None: the transport closes

    try:  # uvicorn imports httptools only where it is installed (uvicorn[standard]); h11 is used without it
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return JsonErrors
    if not issubclass(JsonErrors, HttpToolsProtocol):
        return JsonErrors

    class BoundedHead(JsonErrors):
        in_head = True  # the parser is within a request's line and headers (a connection opens in one)
        head_bytes = 0  # bytes received while it was

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.in_head, self.head_bytes = True, 0

        def on_headers_complete(self) -> None:
            self.in_head = False
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            in_head = self.in_head
            super().data_received(data)
            if in_head and self.in_head and not self.lingering and not self.transport.is_closing():
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD_BYTES:
                    message = f"a request's line and headers are at most {MAX_HEAD_BYTES // 1024} kB"
                    self.send_error(431, "Request Header Fields Too Large", message)

    return BoundedHead

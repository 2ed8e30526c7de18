"""One HTTP request through an ASGI app in this process, its response handed out as it is sent (streams too).

A replica serves with quickdraft's own app (``server/app.py``: the same validation, errors, streaming and
cancellation as ``quickdraft serve``); the ingress hands it a request's method, path and body and relays what it
sends. When the caller stops reading (its client went away), the app hears ``http.disconnect`` and cancels the
request, as it does behind uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from quickdraft.server.access import WAITED


@dataclass(frozen=True)
class ResponseStart:
    """The first thing an app sends: the status and the headers (``(name, value)`` strings)."""

    status: int
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)


async def call_app(
    app: Any, method: str, path: str, body: bytes = b"", waited_s: float = 0.0
) -> AsyncIterator[ResponseStart | bytes]:
    """Yields the response's :class:`ResponseStart`, then its body as the app sends it (chunks of bytes).
    ``waited_s``: how long the request waited on its way (in Ray's queue): its time limit counts it."""
    sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_given = False

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), WAITED: max(0.0, waited_s),
    }  # fmt: skip

    async def run() -> None:
        try:
            await app(scope, receive, sent.put)  # the app's messages, as it sends them
        finally:
            await sent.put(None)

    task = asyncio.create_task(run())
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                headers = tuple((bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in message["headers"])
                yield ResponseStart(int(message["status"]), headers)
            elif message["type"] == "http.response.body" and message.get("body"):
                yield bytes(message["body"])
        await task  # an error of the app's own surfaces here
    finally:
        if not task.done():  # the caller left: the app hears its client go, then is stopped
            disconnected.set()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            task.cancel()

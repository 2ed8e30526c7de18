"""Who may use a server and how much one request may ask: the API key, the body's size, the request's time.

Rules:
- With an API key set, every route but ``/health`` needs ``Authorization: Bearer <key>``; the key is compared in
  constant time, and a missing or wrong one gets 401. ``/metrics`` is open only with ``metrics_public``.
- A key is never printed: not in a log line, an error or this object's repr.
- A body over ``max_body_bytes`` gets 413 before it is parsed (by its declared length, else while it arrives);
  JSON nested more than ``MAX_NESTING`` levels deep gets 400, and so does a body its client stopped sending. A
  body that has not all arrived ``body_timeout_s`` after its reading began gets 408: a client that stalls mid-body
  holds a connection no longer (a timeout of its own, so that a short request timeout still times the answer).
- A request still running ``request_timeout_s`` after it arrived is cancelled: 504, or an error event on a stream.
  A replica's request arrived when the ingress took it: the time it waited in Ray's queue counts.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from quickdraft.errors import ConfigError
from quickdraft.server.errors import ApiError

API_KEY_VARIABLE = "QUICKDRAFT_API_KEY"
MAX_BODY_MB = 8  # a prompt that fills the default pair's 32,768 positions is well under 1 MB of JSON
MAX_NESTING = 64  # JSON levels a body may nest: chat templates and schema compilers recurse through them
REQUEST_TIMEOUT_S = 600.0  # llama-server's default
BODY_TIMEOUT_S = 60.0  # nginx's client_body_timeout default
READ = ("GET", "HEAD")  # the methods of a route that reads a resource: HEAD as HTTP has it, GET's head alone
WAITED = "quickdraft.waited_s"  # ASGI scope key: seconds a request waited before it reached the app (a replica's)


@dataclass(frozen=True)
class Access:
    """A server's access rules (the module's); its repr leaves the key out."""

    api_key: str | None = field(default=None, repr=False)
    metrics_public: bool = False
    max_body_bytes: int = MAX_BODY_MB * 2**20
    request_timeout_s: float | None = REQUEST_TIMEOUT_S  # None: none
    body_timeout_s: float = BODY_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.api_key is not None:
            check_key(self.api_key, "the API key")
        if self.max_body_bytes < 1:
            raise ConfigError(f"the body limit must be >= 1 byte, got {self.max_body_bytes}")
        timeout = self.request_timeout_s
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"--request-timeout must be a number of seconds >= 0 (0: none), got {timeout}")
        if not (math.isfinite(self.body_timeout_s) and self.body_timeout_s > 0):
            raise ConfigError(f"the body timeout must be a number of seconds > 0, got {self.body_timeout_s}")

    @classmethod
    def from_args(cls, api_key: str | None, metrics_public: bool, max_body_mb: float, timeout_s: float) -> Access:
        """The server's flags: ``api_key`` None takes ``$QUICKDRAFT_API_KEY`` (set but blank: refused, as the flag
        is, rather than an open server); ``timeout_s`` 0 means none."""
        if not (math.isfinite(max_body_mb) and max_body_mb > 0):
            raise ConfigError(f"--max-body-mb must be a number of megabytes > 0, got {max_body_mb}")
        if not (timeout_s >= 0 and math.isfinite(timeout_s)):
            raise ConfigError(f"--request-timeout must be a number of seconds >= 0 (0: none), got {timeout_s}")
        key = api_key if api_key is not None else os.environ.get(API_KEY_VARIABLE)
        if api_key is None and key is not None:
            check_key(key, f"${API_KEY_VARIABLE} (unset it to serve without a key)")
        return cls(key, metrics_public, int(max_body_mb * 2**20), timeout_s or None)

    def authorize(self, authorization: str | None, metrics: bool = False) -> None:
        """Raise 401 unless the ``Authorization`` header carries the key (or no key is set, or ``metrics`` and
        the metrics are public)."""
        if self.api_key is None or (metrics and self.metrics_public):
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "a valid API key is needed: Authorization: Bearer <key>", code="invalid_api_key")


def check_key(key: str, named: str) -> None:
    """An API key is printable text, not blank: ``ConfigError`` naming where it came from otherwise."""
    if not key.strip() or not key.isprintable():
        raise ConfigError(f"{named}: an API key must be printable text, not blank")


OPEN = Access()  # no key; the default limits


async def read_body(request: Any, limit: int, timeout_s: float | None = None) -> bytes:
    """The request's body, read up to ``limit`` bytes: 413 beyond, by its declared length or as it arrives; 408 if
    it has not all arrived after ``timeout_s`` (None: no limit)."""
    from starlette.requests import ClientDisconnect  # the serve extra's: this module's rules import without it

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {int(declared)} bytes; this server takes at most {limit}")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise ApiError(413, f"the request body is over {limit} bytes, the most this server takes")
    except ClientDisconnect:  # the client left: an answer reaches no one, and the server did nothing wrong
        raise ApiError(400, "the client closed the connection before its request body arrived") from None
    except TimeoutError:  # a client that stalled mid-body
        message = f"the request body had not all arrived after {timeout_s:g} s ({len(body)} bytes came)"
        raise ApiError(408, message, code="timeout") from None
    return bytes(body)


def check_media(request: Any) -> None:
    """A 415 for a body sent as a media type other than JSON (a form, text/plain: what a web page may post to a
    server on loopback without asking) or compressed; one sent with no ``Content-Type`` is read as JSON."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type and media_type != "application/json" and not media_type.endswith("+json"):
        message = f"the request body must be sent as application/json, not {media_type}"
        raise ApiError(415, message, code="unsupported_media_type")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        message = f"the request body must be sent uncompressed, not with Content-Encoding {encoding}"
        raise ApiError(415, message, code="unsupported_media_type")


async def read_json(request: Any, limit: int, timeout_s: float | None = None) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (413 beyond) within ``timeout_s`` (408 after), or 400 if
    it is not a JSON object in UTF-8 (every endpoint's body is one); :func:`check_media` first."""
    check_media(request)
    body = await read_body(request, limit, timeout_s)
    too_deep = f"the request body nests JSON too deeply (at most {MAX_NESTING} levels)"
    try:
        parsed = json.loads(body.decode("utf-8-sig"))  # UTF-8 only (json reads UTF-16 and -32 too), a BOM allowed
    except RecursionError:
        raise ApiError(400, too_deep) from None
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno}"
        raise ApiError(400, f"the request body is not valid JSON: {error.msg} ({where})") from None
    except UnicodeDecodeError as error:
        byte = error.object[error.start]
        raise ApiError(400, f"the request body is not UTF-8 text: byte 0x{byte:02x} at offset {error.start}") from None
    except ValueError:  # Python's bound on an integer's digits (a 5000-digit number is valid JSON)
        message = f"the request body holds an integer of more than {sys.get_int_max_str_digits()} digits"
        raise ApiError(400, message) from None
    if not isinstance(parsed, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if nesting(parsed) > MAX_NESTING:
        raise ApiError(400, too_deep)
    return parsed


def nesting(value: Any) -> int:
    """How deep ``value``'s lists and objects nest (0 for a scalar), found without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest

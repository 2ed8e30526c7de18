"""Joining Ray for ``serve --replicas``: a Ray of this process's own, or a running cluster's, whose address is
checked first, so that a wrong one is an error naming it rather than Ray's traceback or its endless retries."""

from __future__ import annotations

import queue
import socket
import threading

import ray

from quickdraft.errors import ConfigError

REACH_TIMEOUT_S = 5.0  # how long a cluster's address may take to accept a connection
PASSED_THROUGH = ("auto",)  # addresses Ray resolves itself: the running local cluster


def join(address: str | None) -> None:
    """``ray.init`` at ``address`` (None: a Ray of this process's own), quietly; an address that is not one, or a
    cluster that cannot be reached, is a ``ConfigError`` (setting ``ray_address``)."""
    if address is not None:
        check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    except (ValueError, ConnectionError) as error:  # Ray's own checks: a malformed address, no running cluster
        raise ConfigError(f"cannot join a Ray cluster at {address!r}: {error}", setting="ray_address") from None


def check_reachable(address: str) -> None:
    """A cluster's ``host:port`` (its GCS, as ``ray start --head`` prints it) accepts a connection within
    ``REACH_TIMEOUT_S``; Ray would retry it for minutes. ``ray://`` (Ray Client) and ``auto`` are Ray's to check."""
    if address in PASSED_THROUGH or "://" in address:
        return
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"a Ray cluster's address is host:port (as `ray start --head` prints it), ray://host:port or 'auto', got "
            f"{address!r}",
            setting="ray_address",
        )
    try:
        connected(resolved(host.strip("[]")), int(port))
    except OSError as error:  # refused, unreachable, timed out, or a host name that does not resolve
        reason = error.strerror or str(error) or type(error).__name__
        raise ConfigError(f"cannot reach a Ray cluster at {address}: {reason}", setting="ray_address") from None


def connected(addresses: list[str], port: int) -> None:
    """A connection to the first of ``addresses`` that accepts one (as ``socket.create_connection`` tries a host's
    addresses in turn: ``localhost`` may be ::1 first, and Ray listen on 127.0.0.1), closed; the last error else."""
    failure: OSError = OSError("no address")
    for address in addresses:
        try:
            socket.create_connection((address, port), timeout=REACH_TIMEOUT_S).close()
            return
        except OSError as error:
            failure = error
    raise failure


def resolved(host: str) -> list[str]:
    """``host``'s addresses, looked up within ``REACH_TIMEOUT_S``: a lookup has no timeout of its own, so it runs
    in a thread of its own, left to finish if it hangs."""
    answers: queue.Queue[list[str] | OSError] = queue.Queue(maxsize=1)

    def look_up() -> None:
        try:
            found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            answers.put(list(dict.fromkeys(str(info[4][0]) for info in found)))
        except OSError as error:
            answers.put(error)

    threading.Thread(target=look_up, name="ray-address-lookup", daemon=True).start()
    try:
        answer = answers.get(timeout=REACH_TIMEOUT_S)
    except queue.Empty:
        raise TimeoutError(f"looking up {host!r} took more than {REACH_TIMEOUT_S:g} s") from None
    if isinstance(answer, OSError):
        raise answer
    return answer

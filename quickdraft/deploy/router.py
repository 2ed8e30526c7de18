"""Which replica takes a request: the one its conversation went to before, unless that one is much busier.

The ingress gives each request an affinity key: the start of its conversation (the system prompt and the first user
message of a chat; a completion's first ``COMPLETION_KEY`` characters or token ids, which a continuation of it sends
again), the same for every later turn. Replicas are ranked for a key
by rendezvous hashing (highest ``hash(key, replica)`` first), so a conversation keeps its replica, and with it that
replica's prefix cache and draft caches, while the replicas stay the same; when one is added or lost only the keys
it wins or held move (the router class: ``ray_router.py``). A replica holding more than ``SPILL_SLACK`` requests
beyond the least busy one yields new requests to it (bounded load: 12 conversations at once on two replicas split
unevenly by their hashes alone). Ray Serve sends a request to the first replica of the ranking that has room and
retries dead ones; requests without a key go by Ray's power of two choices.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

KEY_CHARS = 4000  # a conversation's start, enough to tell conversations apart
COMPLETION_KEY = 128  # a completion's start: a continuation sends the earlier prompt and answer, then more


def affinity_key(body: Mapping[str, Any], chat: bool) -> str | None:
    """The conversation's start: what every turn of it sends first (None: nothing to keep together)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        first_user = next((i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"), 0)
        start = json.dumps(messages[: first_user + 1], sort_keys=True, ensure_ascii=False)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, (str, list)) or not prompt:
            return None
        start = prompt[:COMPLETION_KEY] if isinstance(prompt, str) else json.dumps(prompt[:COMPLETION_KEY])
    return start[:KEY_CHARS]


def rendezvous_rank(key: str, replica_ids: list[str]) -> list[str]:
    """The replicas in the order ``key`` prefers them (the same order wherever it is computed)."""

    def weight(replica_id: str) -> bytes:
        text = f"{replica_id}\0{key}".encode(errors="surrogatepass")  # a lone surrogate is the replica's to refuse
        return hashlib.blake2b(text, digest_size=8).digest()

    return sorted(replica_ids, key=weight, reverse=True)


SPILL_SLACK = 2  # requests a conversation's replica may hold beyond the least busy one before new ones go elsewhere


def bounded_rank(ranked: list[str], queue_lengths: dict[str, int | None], slack: int = SPILL_SLACK) -> list[str]:
    """``ranked`` (a key's rendezvous order), unless its first replica holds more than ``slack`` requests beyond the
    least busy one: then the least busy first (rendezvous order among equals). So a burst of new conversations that
    hash alike is spread, and a conversation stays where its caches are while load allows."""
    known = {replica: length for replica, length in queue_lengths.items() if length is not None}
    if ranked[0] not in known or not known or known[ranked[0]] <= min(known.values()) + slack:
        return ranked
    return sorted(ranked, key=lambda replica: (known.get(replica, 0), ranked.index(replica)))


def request_key(pending_request: Any) -> str | None:
    """The affinity key the ingress passed as the handle call's ``key`` keyword argument."""
    kwargs = getattr(pending_request, "kwargs", None) or {}
    key = kwargs.get("key")
    return key if isinstance(key, str) else None

"""The Ray Serve request router of the replicas (imported by Ray by its path; the rule is ``router.py``'s)."""

from __future__ import annotations

from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter

from quickdraft.deploy.router import bounded_rank, rendezvous_rank, request_key


class ConversationRouter(PowerOfTwoChoicesRequestRouter):
    """A request with an affinity key tries the replicas in its key's order (bounded by their queue lengths, as Ray's
    cache of them knows them); one without goes by power of two."""

    async def choose_replicas(self, candidate_replicas: list[Any], pending_request: Any = None) -> list[list[Any]]:
        key = request_key(pending_request)
        if key is None or len(candidate_replicas) < 2:
            return await super().choose_replicas(candidate_replicas, pending_request)
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        lengths = {name: self.replica_queue_len_cache.get(replica.replica_id) for name, replica in by_id.items()}
        ranked = bounded_rank(rendezvous_rank(key, list(by_id)), lengths)
        return [[by_id[replica_id]] for replica_id in ranked]

"""The replica a request goes to: its conversation's start picks it, the same for every later turn."""

from __future__ import annotations

import collections

from quickdraft.deploy.router import affinity_key, bounded_rank, rendezvous_rank, request_key


def test_every_turn_of_a_conversation_has_its_first_turns_key() -> None:
    system = {"role": "system", "content": "You review code."}
    first = [system, {"role": "user", "content": "Look at f()."}]
    later = [*first, {"role": "assistant", "content": "f is fine."}, {"role": "user", "content": "And g()?"}]
    assert affinity_key({"messages": first}, chat=True) == affinity_key({"messages": later}, chat=True)
    other = [system, {"role": "user", "content": "Look at h()."}]
    assert affinity_key({"messages": other}, chat=True) != affinity_key({"messages": first}, chat=True)
    assert affinity_key({"prompt": "def f():"}, chat=False) == "def f():"
    prompt = "Complete the code below. " * 10
    continued = f"{prompt} first answer. And now the tests: "  # a completion's next turn sends all of it again
    assert affinity_key({"prompt": continued}, chat=False) == affinity_key({"prompt": prompt}, chat=False)
    assert affinity_key({"prompt": list(range(300))}, chat=False) == affinity_key({"prompt": list(range(200))}, False)
    surrogate = affinity_key({"prompt": "w1 \ud800"}, chat=False)  # refused by the replica, ranked like any other
    assert surrogate is not None and rendezvous_rank(surrogate, ["r1", "r2"])
    for body, chat in (({}, True), ({"messages": "x"}, True), ({"prompt": ""}, False), ({"prompt": 3}, False)):
        assert affinity_key(body, chat) is None  # nothing to keep together: Ray's power of two choices


def test_rendezvous_ranks_keep_keys_where_they_were_when_replicas_come_and_go() -> None:
    replicas = ["r1", "r2", "r3"]
    keys = [f"conversation {i}" for i in range(600)]
    first = {key: rendezvous_rank(key, replicas)[0] for key in keys}
    assert all(rendezvous_rank(key, list(reversed(replicas)))[0] == first[key] for key in keys)  # order-free
    counts = collections.Counter(first.values())
    assert min(counts.values()) > 150  # spread over the replicas
    after_loss = {key: rendezvous_rank(key, ["r1", "r3"])[0] for key in keys}
    moved = [key for key in keys if after_loss[key] != first[key]]
    assert all(first[key] == "r2" for key in moved)  # only the lost replica's keys move
    grown = {key: rendezvous_rank(key, [*replicas, "r4"])[0] for key in keys}
    assert all(grown[key] in (first[key], "r4") for key in keys)  # a new replica only takes keys


def test_the_router_reads_the_key_the_ingress_passed() -> None:
    import types

    assert request_key(types.SimpleNamespace(kwargs={"key": "k"})) == "k" and request_key(None) is None


def test_a_busy_replica_yields_new_conversations_to_the_least_busy() -> None:
    ranked = ["a", "b", "c"]
    assert bounded_rank(ranked, {"a": 3, "b": 1, "c": 2}) == ranked  # within the slack: the conversation's own
    assert bounded_rank(ranked, {"a": 6, "b": 1, "c": 1}) == ["b", "c", "a"]  # beyond it: least busy first
    assert bounded_rank(ranked, {"a": None, "b": 0, "c": 9}) == ranked  # its length unknown: no reason to move

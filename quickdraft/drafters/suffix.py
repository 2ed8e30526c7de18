"""``suffix``: SuffixDecoding's drafts (Oliaro et al., NeurIPS 2025) without a model: continuations of the
context's suffix scored by how often they followed it, in the request itself and in earlier requests' answers.

Rules:
- Two indexes count which token followed each n-gram (n from :data:`MIN_MATCH` to :data:`MAX_MATCH`): one over the
  request's own tokens (prompt and answer so far), one over the answers of the drafter's earlier requests (the
  global one, at most :data:`GLOBAL_TOKENS` tokens, the oldest answers evicted first).
- A draft token follows the longest suffix of the context and drafts so far that either index has seen; it is the
  token that followed that n-gram most often in both together (ties: the request's latest, then the answers').
  Drafting goes on while the draft's estimated probability, the product of each token's share among the n-gram's
  followers, stays at least :data:`MIN_PROBABILITY`, and for at most :data:`LENGTH_FACTOR` times the first match's
  length (adaptive length): a long match earns long drafts, a short one a few.
- Proposals are deterministic (one-hot q); the target verifies them, so the output never depends on them.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
from quickdraft.drafters.records import DrafterRecords
from quickdraft.runtime.base import KVCache, Runtime

MIN_MATCH, MAX_MATCH = 2, 8  # n-gram lengths matched (a 1-gram's followers are a guess)
MIN_PROBABILITY = 0.1  # SuffixDecoding's default minimum token probability
LENGTH_FACTOR = 1.0  # SuffixDecoding's max_spec_factor: drafts of at most this times the match's length
GLOBAL_TOKENS = 32768  # tokens of earlier answers kept in the global index


@dataclass(eq=False)
class FollowerCounts:
    """How often each token followed each n-gram of some token sequences, and which follower came last (ties).

    An n-gram is keyed by its tuple's hash, which saves most of the memory; two n-grams that collide (about one
    in 2**64) would only share drafts, which the target verifies."""

    counts: dict[int, dict[int, int]] = field(default_factory=dict)  # n-gram's hash -> follower -> count
    latest: dict[int, int] = field(default_factory=dict)  # n-gram's hash -> the follower seen last

    def add(self, tokens: Sequence[int], start: int = 0, sign: int = 1) -> None:
        """Count (``sign`` -1: uncount) the followers of ``tokens``' n-grams that end at positions ``start``.. ."""
        for end in range(max(start, MIN_MATCH), len(tokens)):
            follower = tokens[end]
            for n in range(MIN_MATCH, min(MAX_MATCH, end) + 1):
                key = hash(tuple(tokens[end - n : end]))
                counter = self.counts.setdefault(key, {})
                counter[follower] = counter.get(follower, 0) + sign
                if sign > 0:
                    self.latest[key] = follower
                elif counter[follower] <= 0:
                    del counter[follower]
                    if not counter:
                        del self.counts[key], self.latest[key]
                    elif self.latest[key] == follower:
                        self.latest[key] = next(iter(counter))

    def followers(self, ngram: tuple[int, ...]) -> tuple[dict[int, int], int | None]:
        """The followers of ``ngram`` with their counts, and the one seen last (None: none)."""
        key = hash(ngram)
        return self.counts.get(key, {}), self.latest.get(key)


@dataclass(eq=False)
class SuffixState(DraftState):
    local: FollowerCounts = field(default_factory=FollowerCounts)
    tokens: list[int] = field(default_factory=list)  # the context counted in ``local``
    prompt_length: int = 0

    def catch_up(self, context: Sequence[int]) -> None:
        """Count what the context added; a context that does not extend the one counted is counted anew."""
        counted = len(self.tokens)
        if len(context) < counted or (counted and context[counted - 1] != self.tokens[-1]):
            self.local, self.tokens, counted = FollowerCounts(), [], 0
        self.tokens.extend(context[counted:])
        self.local.add(self.tokens, start=counted)


class SuffixDrafter(Drafter):
    def __init__(self, records: DrafterRecords | None = None) -> None:
        super().__init__(records)
        self.answers: FollowerCounts = FollowerCounts()  # the global index
        self.kept: deque[list[int]] = deque()  # the answers it counts, oldest first
        self.kept_tokens = 0

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> SuffixDrafter:
        return cls(records)

    def start(self, prompt_ids: Sequence[int], target_cache: KVCache) -> SuffixState:
        return SuffixState(prompt_length=len(prompt_ids))

    def finish(self, state: DraftState) -> None:
        """The request's answer joins the global index; the oldest answers leave it beyond its budget."""
        assert isinstance(state, SuffixState)
        answer = state.tokens[max(0, state.prompt_length - MAX_MATCH) :]  # with the prompt's tail it follows
        if len(answer) <= MIN_MATCH:
            return
        self.answers.add(answer)
        self.kept.append(answer)
        self.kept_tokens += len(answer)
        while self.kept_tokens > GLOBAL_TOKENS:
            oldest = self.kept.popleft()
            self.answers.add(oldest, sign=-1)
            self.kept_tokens -= len(oldest)

    def forget(self, keep: Sequence[int] = ()) -> None:
        self.answers, self.kept, self.kept_tokens = FollowerCounts(), deque(), 0

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        proposals = []
        for task in tasks:
            assert isinstance(task.state, SuffixState)
            task.state.catch_up(task.context)
            proposals.append(DraftProposal.copied(self.continuation(task.state, task.num_tokens)))
        return proposals

    def continuation(self, state: SuffixState, num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` drafts after ``state``'s context (the module's rules)."""
        sequence, drafts, probability, limit = list(state.tokens[-MAX_MATCH:]), [], 1.0, num_tokens
        while len(drafts) < limit:
            best = self._best_follower(state, sequence)
            if best is None:
                break
            token, share, matched = best
            if not drafts:
                limit = min(num_tokens, max(1, int(LENGTH_FACTOR * matched)))
            probability *= share
            if probability < MIN_PROBABILITY:
                break
            drafts.append(token)
            sequence = [*sequence[1 - MAX_MATCH :], token]
        return drafts

    def _best_follower(self, state: SuffixState, sequence: list[int]) -> tuple[int, float, int] | None:
        """(token, its share of the followers, the n-gram's length) of the longest suffix either index saw."""
        for n in range(min(MAX_MATCH, len(sequence)), MIN_MATCH - 1, -1):
            ngram = tuple(sequence[-n:])
            (local, local_latest), (shared, shared_latest) = state.local.followers(ngram), self.answers.followers(ngram)
            counts = Counter(local) + Counter(shared)
            if counts:
                token = max(counts, key=lambda t: (counts[t], t == local_latest, t == shared_latest))
                return token, counts[token] / sum(counts.values()), n
        return None

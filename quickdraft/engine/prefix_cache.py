"""Automatic prefix caching: the target caches of finished requests, kept for new requests whose prompts start
with the same tokens (a system prompt, the earlier turns of a chat, an agent's growing transcript).

A finished request leaves its cache here with the tokens it holds. A new request uses the entry that shares the
longest start with its prompt, at least ``min_tokens`` of it, and reads only the rest of the prompt. A prompt that
goes on from the entry's every token (the next turn of its conversation) takes the entry's cache over: the entry
is gone until that request finishes and leaves its own. A prompt that parts from the entry inside it (another
question after the same system prompt, the same question asked again) gets a copy of the shared positions and
leaves the entry for its own conversation. The least recently used entries go first when the kept entries' memory
would exceed the budget. Only for runtimes whose keys and values of a position do not depend on how the
tokens before it were read (``Runtime.reusable_prefixes``, the native runtime): there a request's output is the
same bits whether its prefix was cached or read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quickdraft.errors import ConfigError
from quickdraft.runtime.base import KVCache
from quickdraft.tokens import common_prefix_length

CopyPrefix = Callable[[KVCache, int], KVCache]


@dataclass
class PrefixCacheStats:
    lookups: int = 0  # requests that looked for a cached prefix
    hits: int = 0  # requests that took one over
    cached_tokens: int = 0  # prompt tokens those requests did not read


class PrefixCache:
    """Finished requests' caches within ``budget_bytes`` of memory, an entry of n tokens taking ``entry_bytes(n)``
    (``Runtime.cache_bytes``)."""

    def __init__(
        self, budget_bytes: int, entry_bytes: Callable[[int], int], copy_prefix: CopyPrefix, min_tokens: int = 16
    ) -> None:
        if budget_bytes < 0 or min_tokens < 1:
            raise ConfigError("a prefix cache needs a budget >= 0 and min_tokens >= 1")
        self.budget_bytes, self.entry_bytes, self.min_tokens = budget_bytes, entry_bytes, min_tokens
        self.copy_prefix = copy_prefix  # (cache, n) -> a new cache of its first n positions (Runtime.copy_prefix)
        self._entries: OrderedDict[int, tuple[tuple[int, ...], KVCache]] = OrderedDict()  # oldest first
        self._next_key = 0
        self.stats = PrefixCacheStats()

    @property
    def tokens(self) -> int:
        """Tokens whose keys and values are kept."""
        return sum(len(tokens) for tokens, _ in self._entries.values())

    @property
    def kept_bytes(self) -> int:
        """The memory the kept entries take."""
        return sum(self.entry_bytes(len(tokens)) for tokens, _ in self._entries.values())

    def take(self, prompt_ids: Sequence[int]) -> tuple[KVCache, int] | None:
        """A cache holding the longest start ``prompt_ids`` shares with an entry, and how many prompt tokens it
        holds (at most all but the last: that position's logits give the first token): the entry's own cache,
        rolled back, if the prompt goes on from all its tokens, else a copy; None: no entry shares ``min_tokens``."""
        self.stats.lookups += 1
        best_key, best_length = None, 0
        for key, (tokens, _) in self._entries.items():
            length = common_prefix_length(tokens, prompt_ids)
            if length > best_length:
                best_key, best_length = key, length
        usable = min(best_length, len(prompt_ids) - 1)
        if best_key is None or usable < self.min_tokens:
            return None
        tokens, cache = self._entries[best_key]
        if best_length == len(tokens):  # the conversation goes on: its cache moves to the new request
            del self._entries[best_key]
            cache.truncate(usable)
        else:  # another conversation: the shared start is copied and the entry stays, now the most recent
            self._entries.move_to_end(best_key)
            cache = self.copy_prefix(cache, usable)
        self.stats.hits += 1
        self.stats.cached_tokens += usable
        return cache, usable

    def put(self, token_ids: Sequence[int], cache: KVCache) -> None:
        """Keep ``cache``, which holds ``token_ids`` (from its first position on); the oldest entries leave while
        the budget is exceeded (an entry larger than the whole budget is not kept)."""
        if len(token_ids) < self.min_tokens or self.entry_bytes(len(token_ids)) > self.budget_bytes:
            return
        self._entries[self._next_key] = (tuple(token_ids), cache)
        self._next_key += 1
        while self.kept_bytes > self.budget_bytes:
            self._entries.popitem(last=False)

    def keep(self, committed: Sequence[int], cache: KVCache) -> None:
        """:meth:`put` a finished request's cache with what it holds of its ``committed`` tokens (prompt and
        answer): up to its length, at most all of them (a step's drafts after an end of sequence go)."""
        held = min(int(cache.lengths[0]), len(committed))
        cache.truncate(held)
        self.put(committed[:held], cache)

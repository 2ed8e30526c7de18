"""Token ids -> text, incrementally: streaming deltas and stop strings."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from typing import Any

from quickdraft.vocabularies import special_ids

_INCOMPLETE = "\ufffd"  # what a tokenizer decodes a partial UTF-8 sequence to
CONTEXT_TOKENS = 5  # the prompt's last tokens an answer is decoded after (as many as vLLM's detokenizer takes)


class IncrementalDecoder:
    """Decodes committed tokens one at a time and finds stop strings.

    Text is decoded over a short window of recent tokens (so the cost per token stays
    constant) and released only when it cannot change any more: not while it ends in a
    partial UTF-8 sequence, and not while its tail could still start a stop string. A stop string is
    found once its text is whole, though the token that ends it begins a character that is not yet.
    Special tokens have no text, except those named in ``kept_special`` (a tool format's
    markers): their text stays where they are.

    The text is what the tokens add to the text of ``context`` (the prompt's last tokens), as
    vLLM and llama.cpp decode an answer: a SentencePiece word keeps the space its ``▁`` stands
    for, which a tokenizer drops at the start of a text it decodes alone. A context whose text
    ends in a partial UTF-8 character is not used (the answer's first character would span it),
    nor one whose text the answer's tokens would change.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop: tuple[str, ...] = (),
        min_tokens: int = 0,
        kept_special: tuple[str, ...] = (),
        context: Sequence[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self._dropped = dropped_ids(tokenizer, kept_special) if kept_special else None  # None: skip every special
        self.stop = stop
        self.min_tokens = min_tokens  # stop strings are looked for from the token that makes this many on (vLLM's)
        context = list(context[-CONTEXT_TOKENS:])
        self._ids = context if context and not self._decode(context).endswith(_INCOMPLETE) else []
        self._first = len(self._ids)  # self._ids[self._first:] are the answer's tokens
        self.text = ""  # all decoded text, cut before a stop string once one is found
        self.stopped_by: str | None = None  # the stop string found (the first of those that start earliest)
        self._prefix_offset = 0  # window start: tokens before it are in self.text for good (or are the context)
        self._read_offset = self._first  # tokens up to here are in self.text (or are the context)
        self._released = 0  # characters of self.text handed out by release()
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._starts: list[int] = []  # [tokens read] where the text each token completes begins (non-decreasing)
        self._ends: list[int] = []  # [tokens read] and where it ends (non-decreasing)
        self._final = False

    @property
    def token_ids(self) -> list[int]:
        """The tokens added, in order."""
        return self._ids[self._first :]

    @property
    def stopped(self) -> bool:
        """A stop string was found: the text ends before it."""
        return self.stopped_by is not None

    def add(self, token_id: int) -> None:
        """Append one committed token; sets ``stopped`` when a stop string is complete."""
        self._ids.append(token_id)
        window_before, window_now = self._windows()
        if len(window_now) <= len(window_before):
            return
        searched_from, found = max(0, len(self.text) - self._hold), None
        if window_now.endswith(_INCOMPLETE):  # held until its last character is whole, unless a stop ends before it
            whole = self.text + window_now[len(window_before) :].rstrip(_INCOMPLETE)
            if (found := self._first_stop(whole, searched_from)) is None:
                return
        self._read(window_before, window_now)
        # one found before a partial character stands: the text now holds its U+FFFD, which a stop string could hold
        if (found := found or self._first_stop(self.text, searched_from)) is not None:
            cut, self.stopped_by = found
            self.text = self.text[:cut]

    def _first_stop(self, text: str, searched_from: int) -> tuple[int, str] | None:
        """Where the first stop string in ``text`` from ``searched_from`` on begins, and which it is (the first of
        those that begin there). The earliest occurrence wins, whatever the order of the stop strings: one
        multi-character token can complete several, and cutting at a later one leaks text."""
        stops = self.stop if len(self._ids) - self._first >= self.min_tokens else ()
        found = [(index, stop) for stop in stops if (index := text.find(stop, searched_from)) >= 0]
        if not found:
            return None
        cut = min(index for index, _ in found)
        return cut, next(stop for index, stop in found if index == cut)

    def release(self, final: bool = False) -> str:
        """Text that is safe to show now and was not released before. ``final``: the answer has ended, so a
        trailing partial UTF-8 character is released as the tokenizer decodes it (U+FFFD)."""
        if final and not self._final and not self.stopped and self._read_offset < len(self._ids):
            self._read(*self._windows())
        self._final = self._final or final
        end = len(self.text) if (final or self.stopped) else max(self._released, len(self.text) - self._hold)
        delta = self.text[self._released : end]
        self._released = end
        return delta

    def visible_tokens(self) -> int:
        """How many of the tokens, from the first, have their text released: the tokens that a client may see
        (their log-probabilities). Once the answer has ended (a stop string, or :meth:`release` ``final``), those
        whose text begins before its end: not the tokens of a stop string, nor an end-of-sequence token."""
        if self.stopped or self._final:
            return bisect.bisect_left(self._starts, len(self.text))
        return bisect.bisect_right(self._ends, self._released)

    def _windows(self) -> tuple[str, str]:
        """The window's text without the tokens not yet read, and with them. Where the window's text changes with
        what follows it: the context's (the answer then stands alone), or characters a tokenizer spells anew when a
        broken one follows (SentencePiece's byte fallback reads a run of byte tokens that holds a broken character
        as one U+FFFD per byte, the whole ones too), the window starts at the tokens not yet read."""
        window_before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_now = self._decode(self._ids[self._prefix_offset :])
        if window_now.startswith(window_before):
            return window_before, window_now
        if self._prefix_offset < self._first:
            del self._ids[: self._first]
            self._first = self._read_offset = 0
        self._prefix_offset = self._read_offset
        return "", self._decode(self._ids[self._read_offset :])

    def _read(self, window_before: str, window_now: str) -> None:
        """The tokens since the last read add the text ``window_now`` has past ``window_before`` (the window's text
        before them): appended. Each of them ends with all of it (a character may take several tokens) and begins
        where the complete characters of the tokens before it end: a token holding only bytes of a character that
        a stop string begins with begins inside the stop."""
        read, known = len(self._ids) - self._read_offset, len(window_before)
        text, starts = window_now[known:], [len(self.text)]
        for count in range(1, read):
            spelled = self._decode(self._ids[self._prefix_offset : self._read_offset + count]).rstrip(_INCOMPLETE)
            starts.append(max(starts[-1], len(self.text) + min(len(text), max(0, len(spelled) - known))))
        self._starts += starts
        self._ends += [len(self.text) + len(text)] * read
        self.text += text
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)

    def _decode(self, token_ids: list[int]) -> str:
        """The tokens' text as they spell it: no clean-up of spaces before punctuation (which would make a text
        depend on what follows it, and is not what the model wrote)."""
        if self._dropped is None:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        kept = [t for t in token_ids if t not in self._dropped]
        return self.tokenizer.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@functools.lru_cache(maxsize=16)  # a tokenizer's few sets of kept tokens, each made once (thousands of specials)
def dropped_ids(tokenizer: Any, kept: tuple[str, ...]) -> frozenset[int]:
    """The special tokens that have no text (:func:`~quickdraft.vocabularies.special_ids`, those
    ``skip_special_tokens`` leaves out of a fast tokenizer's text), but for those spelled as one of ``kept``."""
    return frozenset(t for t in special_ids(tokenizer) if tokenizer.convert_ids_to_tokens(t) not in kept)

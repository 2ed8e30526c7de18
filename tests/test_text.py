from __future__ import annotations

import pytest

from quickdraft.text import IncrementalDecoder


class ByteTokenizer:
    """Token i is byte i: multi-byte characters span several tokens."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: bool) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


class PieceTokenizer:
    """Token i is pieces[i]: one token can add several characters at once."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: bool) -> str:
        return "".join(self.pieces[i] for i in token_ids)


class ChunkTokenizer:
    """Token i is the bytes chunks[i]: one token may end a character and begin the next."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: bool) -> str:
        return b"".join(self.chunks[i] for i in token_ids).decode("utf-8", errors="replace")


class ByteFallbackTokenizer:
    """SentencePiece's byte fallback, as tokenizers' ``ByteFallback`` decoder reads it: token i is byte i, and a run
    of them that is no UTF-8 reads as one U+FFFD per token, its whole characters too."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: bool) -> str:
        try:
            return bytes(token_ids).decode("utf-8")
        except UnicodeDecodeError:
            return "\ufffd" * len(token_ids)


def feed(decoder: IncrementalDecoder, text: str) -> list[str]:
    return feed_tokens(decoder, list(text.encode()))


def feed_pieces(pieces: list[str], stop: tuple[str, ...]) -> tuple[IncrementalDecoder, list[str]]:
    decoder = IncrementalDecoder(PieceTokenizer(pieces), stop=stop)
    return decoder, feed_tokens(decoder, list(range(len(pieces))))


def feed_tokens(decoder: IncrementalDecoder, token_ids: list[int]) -> list[str]:
    deltas = []
    for token_id in token_ids:
        decoder.add(token_id)
        deltas.append(decoder.release())
        if decoder.stopped:
            break
    return [*deltas, decoder.release(final=True)]


def test_multibyte_characters_are_released_whole() -> None:
    decoder = IncrementalDecoder(ByteTokenizer())
    deltas = feed(decoder, "aé€b")
    assert "".join(deltas) == decoder.text == "aé€b"
    assert all("\ufffd" not in delta for delta in deltas)


def test_stop_string_cuts_text_and_is_never_released() -> None:
    decoder = IncrementalDecoder(ByteTokenizer(), stop=("END",))
    deltas = feed(decoder, "abc ENx END tail")
    assert decoder.stopped and decoder.text == "abc ENx "
    assert "".join(deltas) == "abc ENx "
    assert len(decoder.token_ids) == len("abc ENx END")


def test_stop_strings_are_looked_for_from_min_tokens_on() -> None:
    """vLLM's min_tokens: a stop string complete before the answer's first min_tokens tokens does not end it."""
    decoder = IncrementalDecoder(ByteTokenizer(), stop=("END",), min_tokens=5)
    feed(decoder, "END ab END tail")
    assert decoder.stopped and decoder.text == "END ab "


def test_earliest_of_several_stop_strings() -> None:
    decoder = IncrementalDecoder(ByteTokenizer(), stop=("zz", "y"))
    feed(decoder, "axyzz")
    assert decoder.text == "ax" and decoder.stopped_by == "y"  # vLLM's stop_reason


BOTH_ORDERS = pytest.mark.parametrize("stop", [("world", "lo w"), ("lo w", "world")])


@BOTH_ORDERS
def test_earliest_stop_wins_when_two_complete_in_one_token(stop: tuple[str, ...]) -> None:
    decoder, deltas = feed_pieces(["hello", " world"], stop)
    assert decoder.stopped and decoder.text == "hel" and decoder.stopped_by == "lo w"
    assert "".join(deltas) == "hel"


@BOTH_ORDERS
def test_earliest_stop_spanning_tokens_keeps_all_text_before_it(stop: tuple[str, ...]) -> None:
    decoder, deltas = feed_pieces(["say hel", "lo", " world", "!"], stop)
    assert decoder.stopped and decoder.text == "say hel"
    assert "".join(deltas) == "say hel"
    assert len(decoder.token_ids) == 3


def test_a_stop_string_is_found_when_its_text_is_whole_before_a_partial_character() -> None:
    """A token may end a stop string and begin the next character (byte-level BPE's b"a\\xc3"): the stop is found at
    that token, not when (if ever: the answer may end first) the character is whole."""
    decoder = IncrementalDecoder(ChunkTokenizer([b"x", b"a\xc3", b"\xa9"]), stop=("a",))
    deltas = feed_tokens(decoder, [0, 1, 2])
    assert decoder.stopped and decoder.text == "".join(deltas) == "x" and decoder.token_ids == [0, 1]
    assert decoder.visible_tokens() == 1  # the stop's token is not shown
    replaced = IncrementalDecoder(ChunkTokenizer([b"x", b"a", b"b\xc3", b"\xa9"]), stop=("b", "ab\ufffd"))
    feed_tokens(replaced, [0, 1, 2, 3])  # the partial character's U+FFFD is no text a stop string can match
    assert replaced.text == "xa" and replaced.stopped_by == "b"
    held = IncrementalDecoder(ChunkTokenizer([b"x", b"b\xc3", b"\xa9"]), stop=("a",))
    assert "".join(feed_tokens(held, [0, 1, 2])) == "xb\u00e9" and not held.stopped  # no stop: held until whole


def test_possible_start_of_a_stop_is_held_back_until_the_end() -> None:
    decoder, deltas = feed_pieces(["hello", " wor"], ("world",))
    assert not decoder.stopped
    assert "wor" not in "".join(deltas[:-1])
    assert "".join(deltas) == decoder.text == "hello wor"


def test_a_cut_partial_character_ends_the_text_as_the_tokenizer_decodes_it() -> None:
    decoder = IncrementalDecoder(ByteTokenizer())
    deltas = feed_tokens(decoder, [*b"ab", *"é".encode()[:1]])  # the answer was cut inside "é"
    assert "".join(deltas) == decoder.text == "ab\ufffd" == ByteTokenizer().decode([*b"ab", 0xC3])


def test_a_character_spelled_anew_by_the_broken_one_after_it_keeps_its_text() -> None:
    """Cut inside its second character, a run of byte tokens reads as U+FFFD per token, the first character too: the
    text keeps that character, then the cut tokens as the tokenizer decodes them, streamed or not; a stop string
    before the cut is found as with any tokenizer."""
    runes = list("ᚠᚢ".encode())  # two characters of three byte tokens each
    for cut in range(1, len(runes)):
        decoder = IncrementalDecoder(ByteFallbackTokenizer())
        deltas = feed_tokens(decoder, runes[:cut])
        whole, broken = divmod(cut, 3)
        assert "".join(deltas) == decoder.text == "ᚠ" * whole + "\ufffd" * broken, cut
        assert decoder.visible_tokens() == cut
    stopped = IncrementalDecoder(ByteFallbackTokenizer(), stop=("ᚠ",))
    feed_tokens(stopped, [*b"a", *runes[:4]])
    assert stopped.stopped and stopped.text == "a"


def test_visible_tokens_are_those_whose_text_is_released() -> None:
    """Their log-probabilities are shown: a held tail's tokens wait, a stop string's tokens are never shown."""
    decoder = IncrementalDecoder(ByteTokenizer(), stop=("END",))
    visible = []
    for token in b"ab EN":
        decoder.add(token)
        decoder.release()
        visible.append(decoder.visible_tokens())
    assert visible == [0, 0, 1, 2, 3]  # "EN" may begin the stop string, so two characters are held
    for token in b"D tail":
        decoder.add(token)
        if decoder.stopped:
            break
    assert decoder.release(final=True) == "" and decoder.text == "ab " and decoder.visible_tokens() == 3
    pieces = IncrementalDecoder(PieceTokenizer(["ab", "cE", "ND", "x"]), stop=("END",))
    for token in range(3):
        pieces.add(token)
    assert pieces.stopped and pieces.text == "abc" and pieces.visible_tokens() == 2  # "cE" holds text before it
    ended = IncrementalDecoder(PieceTokenizer(["ab", ""]))  # "": an end-of-sequence token, skipped in the text
    ended.add(0)
    ended.add(1)
    assert ended.release(final=True) == "ab" and ended.visible_tokens() == 1


class BytePieceTokenizer:
    """Token i is the bytes pieces[i], as byte-level BPE's tokens are: one may end inside a character."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: bool) -> str:
        return b"".join(self.pieces[i] for i in token_ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize(
    ("pieces", "visible"),
    [
        ([b"ab", b" \xf0\x9f", b"\x8d", b"\x95", b"c"], 2),  # a space, then the stop's first bytes: the space shows
        ([b"ab", b" ", b"\xf0", b"\x9f\x8d", b"\x95c"], 2),  # the stop's bytes alone: none shows
        ([b"ab \xf0\x9f\x8d", b"\x95"], 1),  # a token holding text before the stop shows
    ],
)
def test_tokens_wholly_inside_a_stop_string_that_starts_inside_a_token_are_not_visible(
    pieces: list[bytes], visible: int
) -> None:
    """A multi-byte character's tokens are read together with the token that began it; those holding only the
    stop's bytes begin inside the stop, so their log-probabilities are not shown."""
    decoder = IncrementalDecoder(BytePieceTokenizer(pieces), stop=("\U0001f355",))
    for token in range(len(pieces)):
        decoder.add(token)
        if decoder.stopped:
            break
    assert decoder.stopped and decoder.text == "ab " and decoder.visible_tokens() == visible


class StrippingTokenizer(PieceTokenizer):
    """SentencePiece's decoder: a text's leading space (a first word's ``▁``) is dropped."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: bool) -> str:
        return super().decode(token_ids).removeprefix(" ")


def test_an_answer_is_the_text_it_adds_to_its_prompts() -> None:
    tokenizer = StrippingTokenizer([" The", " capital", " is", " Paris", "."])
    alone = IncrementalDecoder(tokenizer)
    after = IncrementalDecoder(tokenizer, context=[0, 1, 2])
    assert feed_tokens(alone, [3, 4])[:2] == ["Paris", "."] and feed_tokens(after, [3, 4])[:2] == [" Paris", "."]
    assert after.token_ids == [3, 4] and after.visible_tokens() == 2
    stops = IncrementalDecoder(tokenizer, stop=("is P",), context=[0, 1, 2])  # the context's text is not searched
    assert "".join(feed_tokens(stops, [3, 4])) == " Paris." and not stops.stopped


def test_a_context_that_ends_in_a_partial_character_is_not_used() -> None:
    euro = list("€".encode())
    decoder = IncrementalDecoder(ByteTokenizer(), context=[*b"ab", euro[0]])
    assert "".join(feed_tokens(decoder, euro[1:] + list(b"c"))) + decoder.release(final=True) == "\ufffd\ufffdc"
    assert "".join(feed_tokens(IncrementalDecoder(ByteTokenizer(), context=list(b"ab")), euro)) == "€"


class CleaningTokenizer(PieceTokenizer):
    """A decoder that cleans up a space before a full stop: a text's end changes with what follows it."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **_: bool) -> str:
        return super().decode(token_ids).replace(" .", ".")


def test_a_context_whose_text_the_answer_changes_is_not_used() -> None:
    decoder = IncrementalDecoder(CleaningTokenizer(["Hello", " ", ".", " it"]), context=[0, 1])
    assert "".join(feed_tokens(decoder, [2, 3])) == ". it" and decoder.token_ids == [2, 3]

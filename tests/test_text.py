from __future__ import annotations

from quickdraft.text import IncrementalDecoder


class ByteTokenizer:
    """Token i is byte i: multi-byte characters span several tokens."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


def feed(decoder: IncrementalDecoder, text: str) -> list[str]:
    deltas = []
    for byte in text.encode():
        decoder.add(byte)
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


def test_earliest_of_several_stop_strings() -> None:
    decoder = IncrementalDecoder(ByteTokenizer(), stop=("zz", "y"))
    feed(decoder, "axyzz")
    assert decoder.text == "ax"

"""Log-probabilities through the server on a byte-level tokenizer, where a token may be part of a UTF-8 character:
each token's ``bytes`` are its own, so a client joining them gets the answer's bytes."""

from __future__ import annotations

import httpx
from conftest import MODEL, TIMEOUT, native_from_hf, serving, tiny_model

from quickdraft.api import Pipeline
from quickdraft.server.responses import TextOffsets
from quickdraft.vocabularies import byte_level_chars

TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def byte_pipeline() -> Pipeline:
    """Tiny native models over one token per byte (GPT-2's byte-level alphabet) and an end-of-sequence token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = dict(byte_level_chars()) | {"<eos>": 256}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    tokenizer.chat_template = TEMPLATE
    return Pipeline(
        target=native_from_hf(tiny_model(len(vocab), seed=5)),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({256}),
    )


def test_each_tokens_bytes_are_its_own() -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "é€ and ü"}],
        "max_tokens": 24,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "drafter": "none",
        "return_token_ids": True,
    }
    with serving(byte_pipeline()) as server:
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT).json()
    choice = answer["choices"][0]
    entries = choice["logprobs"]["content"]
    assert [entry["bytes"] for entry in entries] == [[token] if token < 256 else list(b"<eos>") for token in
                                                     choice["token_ids"]]  # fmt: skip
    assert any(token >= 0x80 for token in choice["token_ids"])  # a byte of a multi-byte character, or none to test
    for entry in entries:
        for top in entry["top_logprobs"]:
            assert len(top["bytes"]) == 1 or top["bytes"] == list(b"<eos>")


def test_text_offsets_count_characters_not_tokens() -> None:
    """A token inside a character and the one that completes it both point at that character's start."""
    pieces = [b"\xe4\xb8", b"\xad", b"a", b"\xf0\x9f", b"\x98", b"\x80", b"b", b"\xff", b"c", b"\xe4", b"d"]
    assert TextOffsets().of(list(enumerate(pieces))) == [0, 0, 1, 2, 2, 2, 3, 4, 5, 6, 7]  # 中 a 😀 b, bad, c, 中's, d
    assert (pieces_text := b"".join(pieces).decode(errors="replace"))[7] == "d" and pieces_text[6] == "\ufffd"
    counter = TextOffsets(10)
    assert counter.of([(0, pieces[0])]) + counter.of([(1, pieces[1]), (2, pieces[2])]) == [10, 10, 11]  # across chunks
    assert TextOffsets(0, frozenset({9})).of([(1, b"a"), (9, b"<eos>"), (2, b"b")]) == [0, 1, 1]  # no text: none


def test_echoed_and_answer_offsets_point_at_their_characters() -> None:
    prompt = "é€ and ü"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 1, "echo": True,
            "drafter": "none"}  # fmt: skip
    with serving(byte_pipeline()) as server:
        choice = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT).json()["choices"][0]
    text, logprobs = choice["text"], choice["logprobs"]
    assert text.startswith(prompt) and logprobs["text_offset"][len(prompt.encode())] == len(prompt)
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"], strict=True):
        if "\ufffd" in token:  # a byte of a character: it points at that character
            assert ord(text[offset]) >= 0x80, (token, offset)
        else:
            assert text[offset:].startswith(token), (token, offset)


def test_a_special_token_inside_an_answer_takes_no_characters() -> None:
    """With ignore_eos an answer goes on past its end-of-sequence token, whose text it leaves out."""
    body = {"model": MODEL, "prompt": "ab", "max_tokens": 24, "temperature": 1.0, "seed": 3, "logprobs": 1,
            "ignore_eos": True, "logit_bias": {"256": 5}, "drafter": "none"}  # fmt: skip
    with serving(byte_pipeline()) as server:
        choice = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT).json()["choices"][0]
    tokens, offsets = choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
    assert "<eos>" in tokens[:-1] and "<eos>" not in choice["text"]  # one inside the answer, no text of its own
    for token, offset in zip(tokens, offsets, strict=True):
        if token != "<eos>" and "\ufffd" not in token:
            assert choice["text"][offset:].startswith(token), (token, offset)
    assert offsets[-1] <= len(choice["text"])

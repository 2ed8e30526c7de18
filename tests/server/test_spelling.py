"""Answers and their tokens on a SentencePiece tokenizer whose decoder drops a text's leading space (Llama 2's,
Mistral's up to v0.3, Phi-3's): an answer is the text it adds to its prompt, its first word's space included; each
token reads as it does after other text; ``text_offset`` points at each token in the echoed prompt and the answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import MODEL, Server, native_from_hf, serving, tiny_model

from quickdraft.api import Pipeline

PROMPT = "w3 w1 w4"
WORDS = 45


def sentencepiece_pipeline() -> Pipeline:
    """Tiny native target and draft over words ``▁w0 .. ▁w44`` with Llama 2's normalizer, decoder and BOS."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(["<unk>", "<s>", "</s>", *(f"▁w{i}" for i in range(WORDS))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} w44{% endfor %}"
    return Pipeline(
        target=native_from_hf(tiny_model(len(vocab), seed=0)),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({2}),
        draft=native_from_hf(tiny_model(len(vocab), seed=1, num_layers=1)),
    )


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return sentencepiece_pipeline()


@pytest.fixture(scope="module")
def server(native: Pipeline) -> Iterator[Server]:
    with serving(native) as running:
        yield running


def test_the_tokenizer_drops_a_texts_leading_space(native: Pipeline) -> None:
    ids = native.encode(PROMPT)
    assert native.tokenizer.convert_ids_to_tokens(ids) == ["<s>", "▁w3", "▁w1", "▁w4"]
    assert native.tokenizer.decode(ids[1:2]) == "w3"  # what an answer alone decoded to, its space lost


@pytest.mark.parametrize("drafter", ["none", "draft-model"])
def test_a_completion_is_the_text_it_adds_to_its_prompt(server: Server, native: Pipeline, drafter: str) -> None:
    client, prompt_ids = server.client(), native.encode(PROMPT)
    fields = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2}
    extra = {"return_token_ids": True, "drafter": drafter}
    choice = client.completions.create(**fields, extra_body=extra).choices[0]  # type: ignore[call-overload]
    whole = native.tokenizer.decode([*prompt_ids, *choice.token_ids], skip_special_tokens=True)
    assert choice.text.startswith(" w") and PROMPT + choice.text == whole
    tokens, offsets = choice.logprobs.tokens, choice.logprobs.text_offset
    assert "".join(tokens) == choice.text and all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    assert all(choice.text[offset:].startswith(token) for token, offset in zip(tokens, offsets, strict=True))
    streamed = client.completions.create(**fields, stream=True, extra_body=extra)  # type: ignore[call-overload]
    pieces = [(c.choices[0].text, c.choices[0].logprobs) for c in streamed if c.choices]
    assert "".join(text for text, _ in pieces) == choice.text
    assert [offset for _, logprobs in pieces if logprobs for offset in logprobs.text_offset] == offsets


def test_echoed_offsets_point_at_each_token(server: Server) -> None:
    fields = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 1, "echo": True}
    choice = server.client().completions.create(**fields).choices[0]  # type: ignore[call-overload]
    tokens, offsets = choice.logprobs.tokens, choice.logprobs.text_offset
    assert choice.text.startswith(PROMPT) and tokens[:4] == ["<s>", " w3", " w1", " w4"]
    assert offsets[:5] == [0, 0, 2, 5, len(PROMPT)]  # BOS and the first word's dropped space take no characters
    assert all(choice.text[offset:].startswith(token) for token, offset in zip(tokens[2:], offsets[2:], strict=True))


def test_a_chat_answers_tokens_spell_its_content(server: Server) -> None:
    answer = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=6, temperature=0, logprobs=True
    )
    content = answer.choices[0].message.content or ""
    assert content.startswith(" w") and "".join(entry.token for entry in answer.choices[0].logprobs.content) == content

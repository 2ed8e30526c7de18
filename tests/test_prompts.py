"""The chat prompts a pipeline encodes: the prefix every chat request starts with."""

from __future__ import annotations

from conftest import word_tokenizer

from quickdraft.api import Pipeline


def test_chat_prefix_is_what_every_chat_request_starts_with() -> None:
    tokenizer = word_tokenizer(16, prefix="")  # words "0" .. "14"
    pipeline = Pipeline(target=None, tokenizer=tokenizer, eos_token_ids=frozenset())
    tokenizer.chat_template = "5 6 {% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert pipeline.chat_prefix() == [5, 6]
    assert pipeline.encode_chat([{"role": "user", "content": "9 9"}]) == [5, 6, 9, 9]
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert pipeline.chat_prefix() == []

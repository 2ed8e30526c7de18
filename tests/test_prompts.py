"""The prompts a pipeline encodes: the prefix every chat request starts with, and fill-in-the-middle prompts."""

from __future__ import annotations

import pytest
from conftest import EOS, listed_tokenizer, word_tokenizer

from quickdraft.api import Pipeline
from quickdraft.errors import ConfigError, PromptError
from quickdraft.prompts import INFILL_FORMATS, encode_infill, infill_of, start_ids


def test_chat_prefix_is_what_every_chat_request_starts_with() -> None:
    tokenizer = word_tokenizer(16, prefix="")  # words "0" .. "14"
    pipeline = Pipeline(target=None, tokenizer=tokenizer, eos_token_ids=frozenset())
    tokenizer.chat_template = "5 6 {% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert pipeline.chat_prefix() == [5, 6]
    assert pipeline.encode_chat([{"role": "user", "content": "9 9"}]) == [5, 6, 9, 9]
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert pipeline.chat_prefix() == []


def test_a_template_that_refuses_a_conversation_or_cannot_be_read_is_a_clear_error() -> None:
    """Gemma 2's template refuses a system turn, Mistral's turns that do not alternate: the template's words, as
    the request's fault; a broken template is the model's."""
    import pytest

    from quickdraft.errors import ModelFilesError, PromptError
    from quickdraft.prompts import encode_chat

    tokenizer = word_tokenizer(8)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    with pytest.raises(PromptError, match="chat template refuses the conversation: System role not supported"):
        encode_chat(tokenizer, [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2"}])
    assert encode_chat(tokenizer, [{"role": "user", "content": "w2"}])
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }"
    with pytest.raises(ModelFilesError, match="chat template cannot be read"):
        encode_chat(tokenizer, [{"role": "user", "content": "w2"}])
    # Mistral's templates take the length of each call's id: a call without one is a TypeError in the template
    tokenizer.chat_template = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.id | length }}{% endfor %}"
    tokenizer.chat_template += "{{ m.content }}{% endfor %}"
    call = {"type": "function", "id": None, "function": {"name": "f", "arguments": {}}}
    with pytest.raises(PromptError, match=r"cannot render the conversation \(TypeError"):
        encode_chat(tokenizer, [{"role": "assistant", "content": "w2", "tool_calls": [call]}])


def test_a_chat_template_of_ones_own_is_checked_on_a_user_turn_or_a_system_and_a_user_turn() -> None:
    import pytest

    from quickdraft.errors import ConfigError
    from quickdraft.prompts import encode_chat, use_chat_template

    tokenizer = word_tokenizer(8)
    system_first = (  # refuses a conversation that does not open with a system turn, as some templates do
        "{% if messages[0].role != 'system' %}{{ raise_exception('the first turn must be the system') }}{% endif %}"
        "{% for m in messages %}{{ m.content }} {% endfor %}"
    )
    opened_only = (  # renders only with the assistant's turn opened, as the server asks for it
        "{% if not add_generation_prompt %}{{ raise_exception('open the turn') }}{% endif %}"
        "{% for m in messages %}{{ m.content }} {% endfor %}"
    )
    use_chat_template(tokenizer, opened_only)
    use_chat_template(tokenizer, system_first)
    assert encode_chat(tokenizer, [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2"}]) == [1, 2]
    bad = (
        ("{% if false %}w1{% endif %}", "as no text at all"),
        ("{{ x.y }}", "'x' is undefined"),
        ("", "empty"),
        ("w1 {% for m in messages %}{{ m.role }} {% endfor %}", "every conversation alike"),  # it drops the turns
    )
    for template, words in bad:
        with pytest.raises(ConfigError, match=words):
            use_chat_template(tokenizer, template)
        assert tokenizer.chat_template == system_first  # the one in use is kept


def test_template_variables_reach_the_template_and_its_own_arguments_are_refused() -> None:
    import pytest

    from quickdraft.errors import ConfigError
    from quickdraft.prompts import encode_chat

    tokenizer = word_tokenizer(8)
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }} {% endfor %}{% if thinking %}w5{% endif %}"
    user = [{"role": "user", "content": "w2"}]
    assert encode_chat(tokenizer, user, template_kwargs={"thinking": True}) == [*encode_chat(tokenizer, user), 5]
    for bad in ({"add_generation_prompt": False}, {"messages": []}, {"conversations": 1}, {1: True}, ["thinking"]):
        with pytest.raises(ConfigError, match="chat_template_kwargs") as refused:
            encode_chat(tokenizer, user, template_kwargs=bad)  # type: ignore[arg-type]
        assert refused.value.setting == "chat_template_kwargs"


FIM = ["<unk>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "a", "b", "c", EOS]


def test_an_infill_prompt_is_the_tokenizers_fill_in_the_middle_format() -> None:
    tokenizer = listed_tokenizer(FIM)
    found = infill_of(tokenizer)
    assert found is not None and found.format is INFILL_FORMATS[0] and found.ends == {FIM.index("<|fim_pad|>")}
    pre, suf, mid, a, b, c = (
        FIM.index(token) for token in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", *"abc")
    )
    assert encode_infill(tokenizer, "a b", "c") == [pre, a, b, suf, c, mid]
    assert encode_infill(tokenizer, [b, a], "c c") == [pre, b, a, suf, c, c, mid]  # a prefix of token ids
    assert encode_infill(tokenizer, "", "c") == [pre, suf, c, mid]  # filling at the very start
    assert encode_infill(tokenizer, "a", "") == [pre, a, suf, mid]  # and at the very end
    pipeline = Pipeline(target=None, tokenizer=tokenizer, eos_token_ids=frozenset())
    assert pipeline.encode_infill((b, a), "c") == [pre, b, a, suf, c, mid]
    for bad in (b"ab", None, 5, [1.5], [-7], [True]):  # bytes would have been their byte values as token ids
        with pytest.raises(PromptError, match="the prefix must"):
            pipeline.encode_infill(bad, "c")  # type: ignore[arg-type]
    plain = listed_tokenizer(["<unk>", "a", EOS])
    assert infill_of(plain) is None
    with pytest.raises(ConfigError, match="no fill-in-the-middle tokens") as missing:
        encode_infill(plain, "a", "a")
    assert missing.value.setting == "suffix"


def test_start_tokens_are_those_before_the_text() -> None:
    from tokenizers.processors import TemplateProcessing

    tokenizer = listed_tokenizer(["<unk>", "<s>", "a", EOS])
    assert start_ids(tokenizer) == []
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"<s> $A {EOS}", special_tokens=[("<s>", 1), (EOS, 3)]
    )
    assert tokenizer("a").input_ids == [1, 2, 3] and start_ids(tokenizer) == [1]  # a BOS, not the EOS


def test_a_special_tokens_text_in_the_code_is_text() -> None:
    """Code that mentions <|fim_middle|> (as this repository's does) keeps it as characters: one middle token, at the
    end, as llama.cpp reads an infill."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(code) for code in range(32, 127)]
    specials = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
    backend = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(chars)}, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(text, special=True) for text in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    middle = tokenizer.convert_tokens_to_ids("<|fim_middle|>")
    ids = encode_infill(tokenizer, "x = '<|fim_middle|>'", "y")
    assert ids.count(middle) == 1 and ids[-1] == middle
    assert tokenizer.decode(ids[1:-3]) == "x = '<|fim_middle|>'"

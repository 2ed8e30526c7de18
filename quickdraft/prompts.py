"""Prompt text -> token ids: plain completions, fill-in-the-middle (a code model's text between a prefix and a
suffix) and chat conversations through the model's chat template."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quickdraft.errors import ConfigError, ModelFilesError, PromptError
from quickdraft.tokens import common_prefix_length

# What rendering a chat template raises for a value it cannot use, besides its own refusals (jinja2's TemplateError)
RENDER_ERRORS = (TypeError, ValueError, LookupError, AttributeError)


def encode(
    tokenizer: Any,
    prompt: str,
    chat: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
    what: str = "the prompt",
) -> list[int]:
    """Prompt text -> token ids; ``chat`` wraps it as a user turn of the chat template (with ``template_kwargs``:
    :func:`encode_chat`'s). ``what`` the text is (a prediction's too), for errors."""
    if not isinstance(prompt, str):
        raise PromptError(f"{what} must be text, got {type(prompt).__name__}")
    if not prompt.strip():
        raise PromptError(f"{what} is empty: give some text to continue")
    if not isinstance(chat, bool):
        raise PromptError(f"chat must be true or false, got {chat!r}")
    require_utf8(prompt, what)
    if chat:
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}], template_kwargs=template_kwargs)
    return list(tokenizer(prompt).input_ids)


@dataclass(frozen=True)
class InfillFormat:
    """How a code model's tokenizer asks for the text between a prefix and a suffix: the tokenizer's start tokens,
    ``prefix`` and the prefix's tokens, ``suffix`` and the suffix's, then ``middle``, after which the model writes
    the middle. It ends at the model's end tokens and at ``ends``, as llama.cpp ends an infill."""

    name: str
    prefix: str
    suffix: str
    middle: str
    ends: tuple[str, ...] = ()  # padding, file and repository separators: the model has left the middle

    def found_in(self, vocabulary: Mapping[str, int]) -> bool:
        """Whether the vocabulary holds its prefix, suffix and middle tokens."""
        return all(token in vocabulary for token in (self.prefix, self.suffix, self.middle))


INFILL_FORMATS = (
    InfillFormat("Qwen2.5-Coder's", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                 ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")),
    InfillFormat("StarCoder's", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                 ("<fim_pad>", "<file_sep>", "<repo_name>", "<reponame>", "<filename>")),
    InfillFormat("DeepSeek-Coder's", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)  # fmt: skip


@dataclass(frozen=True)
class Infill:
    """A tokenizer's fill-in-the-middle format as token ids, found once."""

    format: InfillFormat
    start: tuple[int, ...]  # the tokenizer's start tokens (a BOS), if it adds any
    prefix: int
    suffix: int
    middle: int
    ends: frozenset[int]  # the format's ends the vocabulary holds


@functools.lru_cache(maxsize=8)  # a server's one or two tokenizers; reading a vocabulary takes tens of milliseconds
def infill_of(tokenizer: Any) -> Infill | None:
    """The tokenizer's fill-in-the-middle format (the first of :data:`INFILL_FORMATS` whose three tokens its
    vocabulary holds) as ids; None for none."""
    vocabulary = tokenizer.get_vocab()
    found = next((found for found in INFILL_FORMATS if found.found_in(vocabulary)), None)
    if found is None:
        return None
    ends = frozenset(vocabulary[end] for end in found.ends if end in vocabulary)
    token = (vocabulary[text] for text in (found.prefix, found.suffix, found.middle))
    return Infill(found, tuple(start_ids(tokenizer)), *token, ends)


def encode_infill(tokenizer: Any, prefix: str | Sequence[int], suffix: str) -> list[int]:
    """The prompt that asks the model for the text between ``prefix`` (text, or the bare token ids of it, without
    start tokens) and ``suffix`` (text; empty: the end of the text), in its tokenizer's fill-in-the-middle format;
    ``ConfigError`` naming ``suffix`` for a tokenizer without one. A special token's text inside the code is text,
    not that token (as llama.cpp reads an infill)."""
    found = infill_of(tokenizer)
    if found is None:
        known = ", ".join(known.name for known in INFILL_FORMATS)
        message = f"this model's tokenizer has no fill-in-the-middle tokens ({known}): a suffix needs them"
        raise ConfigError(message, "suffix")
    if not isinstance(suffix, str):
        raise ConfigError(f"the suffix must be text, got {type(suffix).__name__}", "suffix")
    require_utf8(suffix, "the suffix")
    if isinstance(prefix, str):
        require_utf8(prefix, "the prompt")
    prefix_ids = plain_ids(tokenizer, prefix) if isinstance(prefix, str) else list(prefix)
    suffix_ids = plain_ids(tokenizer, suffix)
    return [*found.start, found.prefix, *prefix_ids, found.suffix, *suffix_ids, found.middle]


def plain_ids(tokenizer: Any, text: str) -> list[int]:
    """Text as token ids, every special token's text in it read as text."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids) if text else []


def start_ids(tokenizer: Any) -> list[int]:
    """The tokens the tokenizer puts before a text's own (a BOS), none of those it puts after (an EOS)."""
    marked, plain = (list(tokenizer("a", add_special_tokens=add).input_ids) for add in (True, False))
    return next((marked[:at] for at in range(len(marked)) if marked[at : at + len(plain)] == plain), [])


@dataclass(frozen=True)
class ThinkTags:
    """The tags a family's chat templates put around its model's reasoning."""

    open: str
    close: str


THINK_TAGS = (ThinkTags("<think>", "</think>"), ThinkTags("[THINK]", "[/THINK]"))  # looked for in this order


def thinking_of(template: str) -> ThinkTags | None:
    """The think tags a chat template's model writes its reasoning between; None for a template without them."""
    return next((tags for tags in THINK_TAGS if tags.open in template and tags.close in template), None)


def encode_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """A conversation (``role``/``content`` dicts, an assistant's ``tool_calls`` too) through the chat template,
    ready for the assistant's turn; ``tools``: OpenAI's function tools, rendered by the template;
    ``template_kwargs``: more variables the template reads (vLLM's ``chat_template_kwargs``, e.g. Qwen3's
    ``enable_thinking``), none of them a name the rendering reserves (:func:`reserved_template_names`)."""
    if not getattr(tokenizer, "chat_template", None):
        message = "this model has no chat template: give it one (--chat-template FILE), or send the prompt as text"
        raise PromptError(message, "chat")
    extra = check_template_kwargs(tokenizer, template_kwargs)
    if tools is not None and (
        isinstance(tools, str) or not isinstance(tools, Sequence) or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise PromptError(f"tools must be a list of OpenAI function tools (objects), got {tools!r}")
    if isinstance(messages, str | Mapping) or not isinstance(messages, Sequence) or not messages:
        raise PromptError("a conversation must be a non-empty list of {'role': ..., 'content': ...} messages")
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise PromptError(f"every message needs a role and a content, got {message!r}")
        if not isinstance(message.get("content"), str):
            raise PromptError(f"the {message['role']} message's content must be text, got {message.get('content')!r}")
        require_utf8(message["content"], f"the {message['role']} message")
    import jinja2

    try:
        text = tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, tokenize=False, add_generation_prompt=True, **extra
        )
    except jinja2.TemplateSyntaxError as error:  # the model's template itself is broken
        raise ModelFilesError(f"this model's chat template cannot be read: {error}") from None
    except jinja2.TemplateError as error:  # its own refusal (raise_exception): a system turn, turns not alternating
        raise PromptError(f"this model's chat template refuses the conversation: {error}") from None
    except RENDER_ERRORS as error:  # a value it cannot use (a call's id None)
        reason = f"{type(error).__name__}: {error}"
        raise PromptError(f"this model's chat template cannot render the conversation ({reason})") from None
    require_utf8(text, "the conversation as rendered with its tools and earlier calls")
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def check_template_kwargs(tokenizer: Any, template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``template_kwargs`` as keyword arguments of the tokenizer's ``apply_chat_template``; ConfigError naming
    ``chat_template_kwargs`` for anything but a mapping of names to values, or a name the rendering reserves
    (:func:`reserved_template_names`: ``tokenize``, ``add_generation_prompt``, ``messages``, ...)."""
    if template_kwargs is None:
        return {}
    if not isinstance(template_kwargs, Mapping) or not all(isinstance(name, str) for name in template_kwargs):
        raise ConfigError(
            f"chat_template_kwargs must map names to values, got {template_kwargs!r}", "chat_template_kwargs"
        )
    if taken := sorted(reserved_template_names(type(tokenizer)) & set(template_kwargs)):
        raise ConfigError(
            f"chat_template_kwargs cannot set {', '.join(taken)}: quickdraft sets it", "chat_template_kwargs"
        )
    return dict(template_kwargs)


@functools.cache
def reserved_template_names(tokenizer_class: type) -> frozenset[str]:
    """The names a chat template's variables may not take: the arguments of ``apply_chat_template`` and of the
    function that renders it, and ``messages``."""
    import inspect

    from transformers.utils.chat_template_utils import render_jinja_template

    methods = (tokenizer_class.apply_chat_template, render_jinja_template)
    names = {name for method in methods for name in inspect.signature(method).parameters} - {"kwargs"}
    return frozenset(names | {"messages"})


def generation_prompt(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The text the chat template adds to open the assistant's turn (``add_generation_prompt``), with these
    variables: what a thinking model's prompt says about its answer's start (server/reasoning.py). Empty for a
    template that cannot render a lone user turn."""
    import jinja2

    turn = [{"role": "user", "content": "x"}]
    try:
        extra = check_template_kwargs(tokenizer, template_kwargs)
        opened, closed = (
            tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=add, **extra)
            for add in (True, False)
        )
    except (jinja2.TemplateError, ConfigError, *RENDER_ERRORS):
        return ""
    return opened[len(closed) :] if opened.startswith(closed) else ""


def use_chat_template(tokenizer: Any, template: str) -> None:
    """Make ``template`` (Jinja, as transformers' ``apply_chat_template`` reads it) the tokenizer's chat template in
    place of the model's; ``ConfigError`` naming ``chat_template`` for one that renders neither a user turn nor a
    system and a user turn, renders them as nothing or without the user's text (the model's is kept then)."""
    import jinja2

    if not isinstance(template, str):
        raise ConfigError(f"the chat template must be Jinja text, got {template!r}", "chat_template")
    if not template.strip():
        raise ConfigError("the chat template is empty: give the Jinja text of one", "chat_template")
    previous, tokenizer.chat_template = getattr(tokenizer, "chat_template", None), template
    user, system = {"role": "user", "content": "0"}, {"role": "system", "content": "1"}
    try:
        try:
            turns = [user]
            rendered = encode_chat(tokenizer, turns)
        except PromptError:  # a template may ask for a system turn first
            turns = [system, user]
            rendered = encode_chat(tokenizer, turns)
        as_text = [  # the user's text changed: so must the text (as text: a tiny vocabulary may spell both alike)
            tokenizer.apply_chat_template(
                [*turns[:-1], {"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            for text in ("0", "2")
        ]
    except (ModelFilesError, PromptError, jinja2.TemplateError, *RENDER_ERRORS) as error:
        tokenizer.chat_template = previous
        message = str(error).replace("this model's chat template", "the chat template")
        raise ConfigError(f"{message} (a user turn, with and without a system turn)", "chat_template") from None
    if not rendered:
        tokenizer.chat_template = previous
        raise ConfigError("the chat template renders a conversation as no text at all", "chat_template")
    if as_text[0] == as_text[1]:
        tokenizer.chat_template = previous
        raise ConfigError(
            "the chat template renders every conversation alike: a user turn's text is not in it (it must write "
            "each message's content, looping over `messages`)",
            "chat_template",
        )


def chat_prefix(tokenizer: Any) -> list[int]:
    """The tokens every chat request starts with (the template's system prompt and the user turn's opening):
    what a draft model keeps cached from one conversation to the next."""
    first, second = _two_user_turns(tokenizer)
    return [] if first == second else first[: common_prefix_length(first, second)]


def chat_closing(tokenizer: Any) -> list[int]:
    """The tokens between a user turn's text and the assistant's first token (the end of the user turn and the
    assistant turn's opening): what a conversation the model writes itself is given after its user turn."""
    first, second = _two_user_turns(tokenizer)
    shared = common_prefix_length(first[::-1], second[::-1])
    return [] if first == second else first[len(first) - shared :]


def _two_user_turns(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Two one-turn conversations that differ only in the user's text ("0", "1"), ready for the assistant; two
    empty lists without a chat template. Where they agree is the template's own."""
    if not getattr(tokenizer, "chat_template", None):
        return [], []
    first, second = (encode_chat(tokenizer, [{"role": "user", "content": text}]) for text in ("0", "1"))
    return first, second


def require_utf8(text: str, what: str) -> None:
    """Text a tokenizer can take: undecodable bytes (which Python keeps in command-line arguments as lone
    surrogates) raise ``PromptError`` naming the first one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        if 0xDC80 <= code <= 0xDCFF:  # Python's escape of the byte code - 0xDC00
            found = f"an undecodable byte (0x{code & 0xFF:02x}); convert it first (e.g. iconv -t UTF-8)"
        else:  # a JSON body's "\ud800", say
            found = f"a lone surrogate (U+{code:04X}), which no UTF-8 text holds"
        raise PromptError(f"{what} is not UTF-8 text: character {error.start} is {found}") from None

"""The OpenAI wire format, requests: bodies in, validated as the library validates (:mod:`quickdraft.server.responses`:
the bodies out).

Fields of ``/v1/completions`` and ``/v1/chat/completions``: ``model``, ``prompt`` / ``messages``, ``max_tokens``
(``max_completion_tokens`` for chat), ``temperature``, ``top_p``, ``seed``, ``stop``, ``stream``,
``stream_options.include_usage``, ``n`` (up to :data:`MAX_CHOICES` choices), ``logprobs`` and ``top_logprobs`` (chat;
for completions ``logprobs`` is the number of likeliest tokens to list), ``prediction`` (Predicted Outputs:
``{"type": "content", "content": text or text parts}``, copied as drafts by the hybrid drafters), ``response_format``
(``json_object``, ``json_schema``: structured output), ``logit_bias``, ``presence_penalty`` and ``frequency_penalty``
(:mod:`quickdraft.lossless.adjustments`). quickdraft's extras, which the openai client sends with ``extra_body``:
``top_k``, vLLM's ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos`` and ``stop_token_ids``,
``drafter`` (a name of ``DRAFTERS``), ``policy`` (``goodput``, ``fixed:K``, …), ``num_draft_tokens``,
``max_draft_tokens`` (at most the server's), ``return_token_ids``, ``regex`` or ``grammar`` (xgrammar's EBNF) for
structured output, and ``cache_prompt`` (llama.cpp's name; default true: false reads the prompt whole and keeps nothing
of it). A completion's ``suffix`` (text; "" is the end of the text) asks a code model for the text between its prompt
and the suffix in its tokenizer's fill-in-the-middle format (:func:`quickdraft.prompts.encode_infill`; a 400 without
one); the answer also ends at the format's padding and separator tokens. ``tools`` and ``tool_choice`` go to
:mod:`quickdraft.server.tools`. Which other fields are accepted, refused or unknown is :mod:`quickdraft.server.fields`'s
rule: nothing a client asks for is silently ignored. Without ``max_tokens``, a request gets the server's default, at
most what the context and the server's caches leave after its prompt. A completion's ``echo`` repeats its prompt (a
prompt of token ids as their text) before the answer, with the prompt tokens' log-probabilities where ``logprobs`` asks
(the first one null), as OpenAI's legacy completions do; with ``max_tokens`` 0 it is only that (the prompt scored: one
token is decoded and left out of the answer, its text, log-probability, ids and usage). A message's role is one of
:data:`~quickdraft.server.messages.ROLES`. A bad value raises :class:`ApiError` with the status and message a client
sees.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quickdraft.config import MAX_LOGPROBS, GenerationConfig, LogitAdjustments, SamplingParams
from quickdraft.drafters import DEFAULT_DRAFTER, Drafter
from quickdraft.engine import Request
from quickdraft.errors import PromptError, QuickdraftError
from quickdraft.grammar import GrammarKind, GrammarSpec
from quickdraft.lossless.sampling import is_int
from quickdraft.server.errors import ApiError
from quickdraft.server.fields import (
    check_fields,
    count,
    field,
    finite_number,
    flag,
    json_schema,
    logit_bias,
    optional_text,
    request_seed,
    request_top_k,
    require_utf8_text,
    stop_strings,
    text_parts,
    token_list,
)
from quickdraft.server.messages import chat_messages, prompt_of
from quickdraft.server.reasoning import Thinking
from quickdraft.server.tool_formats import ToolFormat
from quickdraft.server.tools import ToolRequest, parse_tools

# What one request may ask of the server's time (an attacker holding the key included): grammars compile in time that
# grows faster than their text, and a prediction is matched against the whole answer (stop strings: fields.py)
MAX_GRAMMAR_CHARS = 65_536
MAX_PREDICTION_CHARS = 262_144
MAX_CHOICES = 16  # n: each choice is a request of its own


@dataclass(frozen=True)
class ServerDefaults:
    model_names: tuple[str, ...]  # the names ``model`` may take; the first is what responses say
    drafter: str = DEFAULT_DRAFTER
    policy: str | None = None  # None: the library's default (goodput)
    max_tokens: int = 256  # when a request gives none (at most what the context and caches leave after its prompt)
    max_context: int | None = None  # positions the model holds: prompt + answer (None: not checked here)
    max_positions: int | None = None  # positions the server's caches hold for all requests (None: no bound)
    max_draft_tokens: int = 16  # adaptive policies' largest γ: a request's default and limit (costs measured so far)
    split_reasoning: bool = True  # a thinking model's reasoning goes to reasoning_content (server/reasoning.py)
    template_kwargs: dict[str, Any] | None = None  # every conversation's chat template variables (a request's win)


@dataclass(frozen=True)
class ApiRequest:
    """A parsed request: what to generate, and how to answer."""

    serve: Request
    chat: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    tools: ToolRequest | None = None  # the request's tools: its answer's calls are parsed (server/tools.py)
    model: str = ""  # the served name it asked for (its answer's ``model``), the first one if it named none
    created: int = 0  # when it arrived (Unix seconds): its answer's, every chunk's alike
    n: int = 1  # choices
    thinking: Thinking | None = None  # its reasoning is split from its content (server/reasoning.py)
    echo: str | None = None  # a completion's prompt text, which its answer repeats first (OpenAI's echo)
    scores_only: bool = False  # echo with max_tokens 0: the prompt and its log-probabilities, no new token
    silent: frozenset[int] = frozenset()  # the tokens its answer's text leaves out (special ones it does not keep)

    @functools.cached_property
    def choices(self) -> tuple[Request, ...]:
        """The engine requests of its ``n`` choices, ``serve`` first. Choice i of a seeded request samples with the
        seed + i: its choices differ, and the same request gets the same ones again."""
        seed = self.serve.config.sampling.seed
        more = []
        for index in range(1, self.n):
            sampling = self.serve.config.sampling
            if seed is not None:
                sampling = dataclasses.replace(sampling, seed=(seed + index) % 2**64)
            config = dataclasses.replace(self.serve.config, sampling=sampling)
            more.append(dataclasses.replace(self.serve, config=config, request_id=f"{self.serve.request_id}-{index}"))
        return (self.serve, *more)


def parse_request(
    body: Any,
    chat: bool,
    defaults: ServerDefaults,
    encode: Callable[..., list[int]],
    drafter_named: Callable[[str], Drafter],
    tool_format: ToolFormat | None = None,
    infill_ends: frozenset[int] = frozenset(),
    decode: Callable[[list[int]], str] | None = None,
) -> ApiRequest:
    """Validate a request body; ``encode(prompt or messages, chat, tools, template_kwargs, suffix)`` gives the
    prompt's token ids (a completion's with a ``suffix``: the fill-in-the-middle prompt, whose answer also ends at
    ``infill_ends``) and ``drafter_named(name)`` the drafter (raising ``QuickdraftError`` for one the server cannot
    run); ``tool_format``: the chat template's (``tools.tool_format``), which ``tools`` need; ``decode(ids)``: the
    text an echoed prompt of token ids repeats (None: such a prompt cannot be echoed)."""
    model = served_model(body, defaults.model_names)
    n = count(body, "n", 1, MAX_CHOICES) or 1  # null: the default, as OpenAI's
    check_fields(body, chat)
    tools = parse_tools(body, tool_format) if chat else None
    stream = flag(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    if options is not None and not stream:
        raise ApiError(400, "stream_options needs stream set to true", "stream_options")
    for name in set(options or {}) - {"include_usage", "include_obfuscation"}:  # obfuscation: none is added here
        message, code = f"unrecognized stream option {name!r}", "unrecognized_parameter"
        raise ApiError(400, message, f"stream_options.{name}", code=code)
    include_usage = flag(options or {}, "include_usage", False, "stream_options.")
    flag(options or {}, "include_obfuscation", True, "stream_options.")  # none is added: the stream is not padded
    return_token_ids = flag(body, "return_token_ids", False)
    suffix = None if chat else optional_text(body, "suffix")  # fill-in-the-middle: the text the answer goes before
    prompt, echo = (None, False) if chat else (prompt_of(body), flag(body, "echo", False))
    if echo and (suffix is not None or (decode is None and not isinstance(prompt, str))):
        raise ApiError(400, "echo repeats a prompt of text or token ids, and cannot go with a suffix", "echo")
    try:
        variables = template_kwargs(body, defaults.template_kwargs)
        prompt_ids = (
            encode(chat_messages(body, tool_format), True, None if tools is None else tools.tools, variables)
            if chat
            else encode(prompt, False, suffix=suffix)
        )
        sampling = SamplingParams(
            temperature=finite_number(body, "temperature", 1.0),
            top_k=request_top_k(body),
            top_p=finite_number(body, "top_p", 1.0),
            seed=request_seed(body),
            min_p=finite_number(body, "min_p", 0.0),
        )
        scores_only = echo and body.get("max_tokens") == 0 and is_int(body["max_tokens"])  # scored, one token dropped
        if scores_only and field(body, "min_tokens", 0) not in (0, None):
            raise ApiError(400, "max_tokens 0 scores the prompt alone: no new tokens for min_tokens", "min_tokens")
        config = GenerationConfig(
            max_new_tokens=_max_tokens(
                {**body, "max_tokens": 1} if scores_only else body, chat, len(prompt_ids), defaults, scores_only
            ),
            num_draft_tokens=field(body, "num_draft_tokens", None),
            sampling=sampling,
            stop=stop_strings(body),
            policy=field(body, "policy", None) or (None if "num_draft_tokens" in body else defaults.policy),
            max_draft_tokens=field(body, "max_draft_tokens", defaults.max_draft_tokens),
            logprobs=(logprobs := _logprobs(body, chat)),
            prompt_logprobs=logprobs if echo else None,  # echoed, the prompt's tokens carry theirs
            grammar=_grammar(body, tools),
            min_tokens=field(body, "min_tokens", 0),
            ignore_eos=flag(body, "ignore_eos", False),
            stop_token_ids=token_list(body, "stop_token_ids") + (() if suffix is None else tuple(sorted(infill_ends))),
            kept_special_tokens=() if tools is None else tools.format.kept,
            adjustments=LogitAdjustments(
                logit_bias(body),
                *(finite_number(body, name, 0.0) for name in ("presence_penalty", "frequency_penalty")),
                repetition_penalty=finite_number(body, "repetition_penalty", 1.0),
            ),
        )
        if config.max_draft_tokens > defaults.max_draft_tokens:
            limit = defaults.max_draft_tokens
            message = f"max_draft_tokens is at most {limit} here (--max-draft-tokens): its costs are measured that far"
            raise ApiError(400, message, "max_draft_tokens")
        spec = config.policy_spec
        given = body.get("policy") is not None and body.get("num_draft_tokens") is not None
        if given and not spec.reads_num_draft_tokens:  # its own argument gives γ, or it reads none
            message = f"num_draft_tokens is not used by the {spec} policy: give the drafts per step once"
            raise ApiError(400, message, "num_draft_tokens")
        drafter = field(body, "drafter", defaults.drafter)
        if not isinstance(drafter, str):
            raise ApiError(400, f"drafter must be a drafter's name, got {drafter!r}", "drafter")
        try:
            drafter_object = drafter_named(drafter)
        except QuickdraftError as error:
            raise ApiError(400, str(error), "drafter") from None
        prediction = _prediction(body) if body.get("prediction") is not None else ""
        prediction_ids = encode(prediction, False) if prediction else []
        serve = Request(
            tuple(prompt_ids), config, drafter_object, prediction_ids=tuple(prediction_ids),
            cache_prompt=flag(body, "cache_prompt", True),
        )  # fmt: skip
    except QuickdraftError as error:  # the library's own validation: empty prompt, bad sampling values, ...
        raise ApiError(400, str(error), error_param(error, chat)) from None
    echoed = None  # a prompt of token ids echoes as their text (decode is given: checked above)
    if echo:
        echoed = prompt if isinstance(prompt, str) else decode(list(prompt_ids)) if decode is not None else None
    return ApiRequest(
        serve, chat, stream, include_usage, return_token_ids, tools, model, int(time.time()), n, echo=echoed,
        scores_only=scores_only,
    )  # fmt: skip


def served_model(body: Mapping[str, Any], model_names: tuple[str, ...]) -> str:
    """The served name a request asks for (the first where it names none); another name is a 404."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model must be a model's name, got {model!r}", "model")
    if model is not None and model not in model_names:
        message = f"the model {model!r} does not exist; this server serves {model_names[0]!r}"
        raise ApiError(404, message, "model", code="model_not_found")
    return model or model_names[0]


def template_kwargs(body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """vLLM's ``chat_template_kwargs``: more variables for the chat template (``{"enable_thinking": false}``), over
    the server's ``defaults`` (``serve --chat-template-kwargs``) name by name."""
    value = body.get("chat_template_kwargs")
    if value is not None and not (isinstance(value, Mapping) and all(isinstance(name, str) for name in value)):
        raise ApiError(400, "chat_template_kwargs must be an object of template variables", "chat_template_kwargs")
    merged = {**(defaults or {}), **(value or {})}
    return merged if merged or value is not None else None


def error_param(error: QuickdraftError, chat: bool) -> str | None:
    """The request field behind a library error: a prompt's, or the setting a ``ConfigError`` names."""
    if isinstance(error, PromptError):
        return "messages" if chat else "prompt"
    api_names = {
        "max_new_tokens": "max_tokens",
        "logprobs": "top_logprobs",
        **{kind.value: "response_format" for kind in (GrammarKind.JSON, GrammarKind.JSON_SCHEMA)},
    }
    setting = getattr(error, "setting", None)
    return api_names.get(setting, setting) if chat or setting != "logprobs" else setting


def _max_tokens(
    body: Mapping[str, Any], chat: bool, prompt_tokens: int, defaults: ServerDefaults, scores_only: bool = False
) -> int:
    """The answer's length limit: ``max_tokens`` (chat: or ``max_completion_tokens``, the same if both), else the
    server's default (raised to ``min_tokens``) cut to what the context and the server's caches leave; a request that
    cannot fit is refused. ``scores_only``: an echo with max_tokens 0, which decodes one token it does not show."""
    given = {name: count(body, name, 1) for name in ("max_tokens", "max_completion_tokens")[: 2 if chat else 1]}
    values = {value for value in given.values() if value is not None}
    if len(values) > 1:
        raise ApiError(400, "max_tokens and max_completion_tokens differ: give one", "max_completion_tokens")
    limit = values.pop() if values else None
    name = "max_completion_tokens" if given.get("max_completion_tokens") else "max_tokens"
    holders = [  # what holds the prompt and the answer: how many positions, said how
        (defaults.max_context, "this model's context holds {} tokens"),
        (defaults.max_positions, "this server's caches hold {} tokens for all its requests together"),
    ]
    for size, holds in holders:
        if size is None:
            continue
        if limit is not None and prompt_tokens + limit > size:
            asks = f"up to {limit} new ones; shorten the prompt or lower {name}"
            if scores_only:
                asks = "the one that echo with max_tokens 0 decodes and does not show; shorten the prompt"
            message = (
                f"{holds.format(size)}, but the request asks for {prompt_tokens + limit}: {prompt_tokens} in the "
                f"prompt and {asks}"
            )
            raise ApiError(400, message, "messages" if chat else "prompt", code="context_length_exceeded")
        if prompt_tokens >= size:
            message = f"the prompt has {prompt_tokens} tokens, and {holds.format(size)}"
            raise ApiError(400, message, "messages" if chat else "prompt", code="context_length_exceeded")
    if limit is not None:
        return limit
    rooms = [size - prompt_tokens for size, _ in holders if size is not None]
    at_least = body.get("min_tokens") if is_int(body.get("min_tokens")) else 0  # a default leaves room for it
    return min([max(defaults.max_tokens, at_least), *rooms])


def _grammar(body: Mapping[str, Any], tools: ToolRequest | None) -> GrammarSpec | None:
    """The grammar the output must follow: ``response_format`` (``json_object``, ``json_schema`` with its
    ``schema``; ``text``: none), quickdraft's ``regex`` or ``grammar`` (xgrammar's EBNF), at most one of them, and
    the tools' (:meth:`ToolRequest.grammar`): a required call's, the content or calls, calls of strict functions."""
    response_format = body.get("response_format") or {"type": "text"}
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(response_format, Mapping) or response_format.get("type") not in kinds:
        raise ApiError(400, "response_format.type must be text, json_object or json_schema", "response_format")
    format_type = response_format["type"]
    allowed = {"type", "json_schema"} if format_type == "json_schema" else {"type"}
    if unknown := sorted(set(response_format) - allowed):
        raise ApiError(400, f"response_format of type {format_type} takes no {', '.join(unknown)}", "response_format")
    asked: list[tuple[GrammarKind, str, str]] = []  # (kind, text, the field that asks for it)
    if format_type == "json_object":
        asked.append((GrammarKind.JSON, "", "response_format"))
    elif format_type == "json_schema":
        schema = json.dumps(json_schema(response_format.get("json_schema")))
        asked.append((GrammarKind.JSON_SCHEMA, schema, "response_format"))
    for name, kind in (("regex", GrammarKind.REGEX), ("grammar", GrammarKind.EBNF)):
        if body.get(name) is not None:
            if not isinstance(body[name], str):
                raise ApiError(400, f"{name} must be a string", name)
            asked.append((kind, body[name], name))
    for kind, text, name in asked:  # before a spec is made: checking a schema compiles its patterns
        if len(text) > MAX_GRAMMAR_CHARS:  # compiling takes time that grows faster than the text
            message = f"a {kind.value} constraint is at most {MAX_GRAMMAR_CHARS} characters, got {len(text)}"
            raise ApiError(400, message, name)
    specs = [GrammarSpec(kind, text) for kind, text, _ in asked]
    if len(specs) > 1:
        raise ApiError(400, "give one of response_format (json), regex and grammar", "response_format")
    content = specs[0] if specs and format_type != "text" else None
    call = None if tools is None else tools.grammar(content)  # a response_format shapes content, not calls
    if call is not None and specs and content is None:  # a regex or grammar: the whole answer, calls included
        message = f"{specs[0].kind.value} constrains the whole answer: not beside a required call or strict functions"
        raise ApiError(400, message, specs[0].kind.value)
    return call or (specs[0] if specs else None)


def _logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    """How many likeliest tokens to list beside each new token's log-probability; None: no log-probabilities.
    Chat: ``logprobs`` true and ``top_logprobs`` (0-20); completions: ``logprobs`` is that number."""
    if not chat:
        return count(body, "logprobs", 0, MAX_LOGPROBS)
    wanted, top = flag(body, "logprobs", False), count(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise ApiError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
    return (0 if top is None else top) if wanted else None


def _prediction(body: Mapping[str, Any]) -> str:
    """The text of a ``prediction`` object: ``{"type": "content", "content": text or a list of text parts}``."""
    prediction = body["prediction"]
    if not isinstance(prediction, Mapping) or prediction.get("type") != "content":
        raise ApiError(400, 'prediction must be {"type": "content", "content": ...}', "prediction")
    content = prediction.get("content")
    if isinstance(content, list):
        content = text_parts(content, "prediction.content", "prediction")
    if not isinstance(content, str):
        raise ApiError(400, "prediction.content must be text or a list of text parts", "prediction")
    if len(content) > MAX_PREDICTION_CHARS:  # matching the answer against it costs its length times the answer's
        raise ApiError(400, f"prediction.content is at most {MAX_PREDICTION_CHARS} characters", "prediction")
    require_utf8_text(content, "prediction.content", "prediction")
    return content


# -- responses --------------------------------------------------------------------------------------------

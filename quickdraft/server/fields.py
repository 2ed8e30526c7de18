"""Which fields a request body may hold, and what each kind gets. Nothing a client asks for is dropped silently.

- The fields this server reads (:data:`CHAT_FIELDS`, :data:`COMPLETION_FIELDS`): validated by
  :mod:`quickdraft.server.protocol`.
- Fields that change nothing here (:data:`HARMLESS`: ``user``, ``metadata``, ``store``, ...): accepted when they
  hold OpenAI's type for them (:func:`check_harmless`).
- Fields that would change the answer and that this server does not implement (:data:`UNSUPPORTED`: OpenAI's
  legacy functions, ``best_of``, a reasoning model's effort, ...):
  400 ``unsupported_parameter`` unless they hold the value that changes nothing.
- A field of the other endpoint (:data:`OTHER_ENDPOINT`) gets a 400 that says where it belongs; any other name a
  400 ``unrecognized_parameter``, as OpenAI answers an unrecognized argument (a typo such as ``max_tokenz`` would
  otherwise fall back to the default silently).

The readers below (:func:`flag`, :func:`count`, :func:`stop_strings`, ...) check one field's value each and raise a
400 that names it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from quickdraft.errors import PromptError
from quickdraft.lossless.sampling import MAX_SEED, is_int, is_number
from quickdraft.prompts import require_utf8
from quickdraft.server.errors import ApiError

COMMON_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n", "logprobs",
    "prediction", "response_format", "logit_bias", "presence_penalty", "frequency_penalty",
    # quickdraft's extras (the openai client sends them with extra_body)
    "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "drafter", "policy",
    "num_draft_tokens", "max_draft_tokens", "return_token_ids", "regex", "grammar", "cache_prompt",
})  # fmt: skip
CHAT_FIELDS = COMMON_FIELDS | {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "chat_template_kwargs",
}  # fmt: skip
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "suffix", "echo"}
MAX_STOPS, MAX_STOP_CHARS = 16, 1_024  # every stop string is looked for after every token
# fields that change nothing here (checked against OpenAI's types: a wrong type is a client's bug)
HARMLESS_TEXT = ("user", "prompt_cache_key", "safety_identifier")  # strings
HARMLESS = frozenset({*HARMLESS_TEXT, "service_tier", "metadata", "store", "prompt_cache_retention",
                      "prompt_cache_options"})  # fmt: skip
MAX_ID_DIGITS = 18  # a token id is written in fewer digits than this
CACHE_RETENTIONS = ("in_memory", "24h")  # OpenAI's prompt_cache_retention: how long its cache keeps a prefix
CACHE_OPTIONS = {"mode": ("implicit", "explicit"), "ttl": ("30m", "12h")}  # prompt_cache_options' own values
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")  # OpenAI's; one tier here
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's limits
# fields that change the answer and this server does not implement, with the values that change nothing
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None, []), "function_call": (None, "none"),
    "best_of": (None, 1), "audio": (None,), "modalities": (None, ["text"]),
    "web_search_options": (None,), "reasoning_effort": (None,), "verbosity": (None,),
}  # fmt: skip
# fields of the other endpoint: what to say, and the values that change nothing there (an empty tools list)
OTHER_ENDPOINT: dict[str, dict[str, tuple[str, tuple[Any, ...]]]] = {
    "chat": {
        "prompt": ("/v1/chat/completions takes messages; a prompt goes to /v1/completions", ()),
        "suffix": ("a suffix (fill-in-the-middle) goes to /v1/completions", ()),
        "echo": ("echo repeats a completion's prompt: it goes to /v1/completions", (False,)),
    },
    "completions": {
        "messages": ("/v1/completions takes a prompt; messages go to /v1/chat/completions", ()),
        "max_completion_tokens": ("/v1/completions takes max_tokens", ()),
        "top_logprobs": ("/v1/completions takes logprobs: the number of likeliest tokens to list", ()),
        "tools": ("tools need /v1/chat/completions", ([],)),
        "tool_choice": ("tool_choice needs /v1/chat/completions", ("none",)),
        "parallel_tool_calls": ("parallel_tool_calls needs /v1/chat/completions", (True, False)),
        "chat_template_kwargs": ("chat_template_kwargs needs /v1/chat/completions", ({},)),
    },
}


def check_fields(body: Mapping[str, Any], chat: bool) -> None:
    """Raise :class:`ApiError` for a field this endpoint does not know or an unsupported one that would change the
    answer (the rules above)."""
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    other = OTHER_ENDPOINT["chat" if chat else "completions"]
    check_harmless(body)
    for name, value in body.items():
        if name in known or name in HARMLESS or (value is None and name not in UNSUPPORTED):
            continue  # a null field asks for nothing
        if name in UNSUPPORTED:
            if not any(_same(value, allowed) for allowed in UNSUPPORTED[name]):
                raise ApiError(400, f"{name} is not supported by this server", name, code="unsupported_parameter")
        elif name in other:
            message, harmless = other[name]
            if not any(_same(value, allowed) for allowed in harmless):
                raise ApiError(400, message, name, code="unsupported_parameter")
        else:
            raise ApiError(400, f"unrecognized request argument: {name}", name, code="unrecognized_parameter")


def check_harmless(body: Mapping[str, Any]) -> None:
    """Raise :class:`ApiError` for a field of :data:`HARMLESS` that is not null and not what OpenAI takes: text,
    ``service_tier`` one of :data:`SERVICE_TIERS`, ``store`` true or false, ``metadata`` an object of at most 16
    strings under keys of at most 64 characters, each at most 512, ``prompt_cache_retention`` one of
    :data:`CACHE_RETENTIONS`."""
    for name in HARMLESS_TEXT:
        optional_text(body, name)
    tier = optional_text(body, "service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise ApiError(400, f"service_tier must be one of {', '.join(SERVICE_TIERS)}, got {tier!r}", "service_tier")
    flag(body, "store", False)
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention not in CACHE_RETENTIONS:
        message = f"prompt_cache_retention must be {' or '.join(CACHE_RETENTIONS)}, got {retention!r}"
        raise ApiError(400, message, "prompt_cache_retention")
    _cache_options(body.get("prompt_cache_options"))
    metadata = body.get("metadata")
    if metadata is None:
        return
    if not (isinstance(metadata, Mapping) and all(isinstance(v, str) for v in metadata.values())):
        raise ApiError(400, f"metadata must be an object of strings, got {metadata!r}", "metadata")
    if len(metadata) > MAX_METADATA_KEYS:
        raise ApiError(400, f"metadata holds at most {MAX_METADATA_KEYS} keys, got {len(metadata)}", "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            limits = f"{MAX_METADATA_KEY_CHARS} characters a key, {MAX_METADATA_VALUE_CHARS} a value"
            entry = key[:MAX_METADATA_KEY_CHARS] + ("..." if len(key) > MAX_METADATA_KEY_CHARS else "")
            raise ApiError(400, f"metadata holds at most {limits}: the entry {entry!r} is longer", "metadata")


def _cache_options(options: Any) -> None:
    """``prompt_cache_options``: its ``mode`` and ``ttl`` (how OpenAI's cache keeps a prefix) are OpenAI's values and
    change nothing here; ``prewarm`` (read the prompt, write no answer) and ``comparison_response_id`` (a kept
    response's diagnostics) ask for what this server does not do."""
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise ApiError(400, f"prompt_cache_options must be an object, got {options!r}", "prompt_cache_options")
    check_keys(options, ("comparison_response_id", "mode", "prewarm", "ttl"), "prompt_cache_options")
    for name, values in CACHE_OPTIONS.items():
        if options.get(name) is not None and options[name] not in values:
            message = f"prompt_cache_options.{name} must be {' or '.join(values)}, got {options[name]!r}"
            raise ApiError(400, message, f"prompt_cache_options.{name}")
    prewarm = options.get("prewarm")
    if prewarm is not None and not isinstance(prewarm, bool):
        message = f"prompt_cache_options.prewarm must be true or false, got {prewarm!r}"
        raise ApiError(400, message, "prompt_cache_options.prewarm")
    if prewarm:
        message = "this server does not read a prompt without answering it: send the request itself"
        raise ApiError(400, message, "prompt_cache_options.prewarm", code="unsupported_parameter")
    if options.get("comparison_response_id") is not None:
        message = "this server keeps no responses to compare a cache with"
        raise ApiError(400, message, "prompt_cache_options.comparison_response_id", code="unsupported_parameter")


def _same(value: Any, allowed: Any) -> bool:
    """``value`` is ``allowed``; a bool equals only a bool here (echo 0 is not echo false)."""
    return value == allowed and isinstance(value, bool) == isinstance(allowed, bool)


def flag(body: Mapping[str, Any], name: str, default: bool, where: str = "") -> bool:
    """A true-or-false field (``where``: the object holding it, for the message); a string such as "false" is
    refused rather than read as true."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{where}{name} must be true or false, got {value!r}", where.rstrip(".") or name)
    return value


def optional_text(body: Mapping[str, Any], name: str) -> str | None:
    """A text field; None where absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string, got {value!r}", name)
    return value


def count(body: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    """A whole-number field in [``low``, ``high``]; None where absent."""
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value) or value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ApiError(400, f"{name} must be a whole number {bounds}, got {value!r}", name)
    return value


def text_parts(content: list[Any], where: str, param: str, separator: str = "") -> str:
    """The text of OpenAI's content parts, ``separator`` between them; a part that is not ``{"type": "text", "text":
    ...}`` (an image, an audio clip, a bare string) is refused: the model would answer without it."""
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            if isinstance(kind, str):
                message = f"{where} holds a content part of type {kind!r}; this server reads text parts only"
            else:
                message = f'{where} content parts must be objects {{"type": "text", "text": ...}}'
            raise ApiError(400, message, param, code="unsupported_parameter" if isinstance(kind, str) else None)
        if not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}: a text part's text must be a string", param)
        texts.append(part["text"])
    return separator.join(texts)


def field(body: Mapping[str, Any], name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value


def finite_number(body: Mapping[str, Any], name: str, default: float) -> Any:
    value = field(body, name, default)
    if not is_number(value) or not math.isfinite(value):
        raise ApiError(400, f"{name} must be a finite number, got {value!r}", name)
    return value


def request_seed(body: Mapping[str, Any]) -> Any:
    """The request's seed: OpenAI's is a signed 64-bit integer, the library's unsigned; a negative one is taken as
    its two's complement (-1 is 2**64 - 1)."""
    seed = field(body, "seed", None)
    if seed is not None and not (is_int(seed) and -(2**63) <= seed <= MAX_SEED):
        raise ApiError(400, f"seed must be an integer in [-2**63, 2**64 - 1], got {seed!r}", "seed")
    return None if seed is None else seed % (MAX_SEED + 1)


def request_top_k(body: Mapping[str, Any]) -> Any:
    """The request's top_k: 0 is off, and so is -1 (vLLM's off, which its clients send)."""
    top_k = field(body, "top_k", 0)
    return 0 if is_int(top_k) and top_k == -1 else top_k


def token_list(body: Mapping[str, Any], name: str) -> tuple[Any, ...]:
    """A list of token ids (each checked by the library)."""
    value = field(body, name, [])
    if not isinstance(value, list):
        raise ApiError(400, f"{name} must be a list of token ids, got {value!r}", name)
    return tuple(value)


def logit_bias(body: Mapping[str, Any]) -> dict[int, Any]:
    """``logit_bias`` as token ids and biases: JSON's keys are strings, OpenAI's are token ids written in decimal."""
    bias = field(body, "logit_bias", {})
    if not isinstance(bias, Mapping):
        raise ApiError(400, f"logit_bias must be an object mapping token ids to biases, got {bias!r}", "logit_bias")
    for key in bias:
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ApiError(400, f'logit_bias\'s keys must be token ids such as "50256", got {key!r}', "logit_bias")
        if len(key) > MAX_ID_DIGITS:  # no vocabulary is that large (and Python reads at most 4300)
            raise ApiError(400, f"logit_bias names no token: a key has {len(key)} digits", "logit_bias")
    ids = {int(key): value for key, value in bias.items()}
    if len(ids) < len(bias):  # "7" and "07" name one token
        raise ApiError(400, 'logit_bias names a token twice (as "7" and "07"): give each once', "logit_bias")
    return ids


def require_utf8_text(text: str, what: str, param: str) -> None:
    """Text that is UTF-8 (a JSON body's lone surrogate "\\ud800" is not), else a 400 on ``param``."""
    try:
        require_utf8(text, what)
    except PromptError as error:
        raise ApiError(400, str(error), param) from None


def stop_strings(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = field(body, "stop", [])
    if not isinstance(stop, (str, list)):
        raise ApiError(400, "stop must be a string or a list of strings", "stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOPS or any(isinstance(text, str) and len(text) > MAX_STOP_CHARS for text in stops):
        message = f"stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters (each is looked for "
        raise ApiError(400, message + "after every token)", "stop")
    for text in stops:
        if isinstance(text, str):
            require_utf8_text(text, "a stop string", "stop")
    return stops


def json_schema(described: Any) -> Mapping[str, Any]:
    """The schema of ``response_format.json_schema`` (OpenAI's: a ``name`` of up to 64 letters, digits, ``_`` and
    ``-``, the ``schema``, ``strict`` and a ``description``), each part checked."""
    where = "response_format.json_schema"
    if not isinstance(described, Mapping):
        raise ApiError(400, f"{where} must be an object with a name and a schema", "response_format")
    if unknown := sorted(set(described) - {"name", "schema", "strict", "description"}):
        raise ApiError(400, f"{where} takes name, schema, strict and description, not {', '.join(unknown)}",
                       "response_format")  # fmt: skip
    if not (isinstance(described.get("name"), str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", described["name"])):
        message = f"{where}.name must be 1 to 64 letters, digits, _ or -, got {described.get('name')!r}"
        raise ApiError(400, message, "response_format")
    if not isinstance(described.get("strict"), bool | None):
        raise ApiError(400, f"{where}.strict must be true or false, got {described['strict']!r}", "response_format")
    if not isinstance(described.get("description"), str | None):
        raise ApiError(400, f"{where}.description must be text", "response_format")
    if not isinstance(described.get("schema"), Mapping):
        raise ApiError(400, f"{where}.schema must be a JSON schema object", "response_format")
    return described["schema"]


def check_keys(value: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    """A key of ``value`` (an object inside a request: a tool, a message) this server does not read is refused, as
    OpenAI refuses one (``unknown_parameter``), unless null (which asks for nothing): it would be dropped silently,
    and a misspelt ``parameters`` would leave a function's arguments free."""
    unknown = [name for name, item in value.items() if name not in known and item is not None]
    if unknown:
        param = f"{where}.{unknown[0]}"
        raise ApiError(400, f"unknown parameter: '{param}'", param, code="unknown_parameter")

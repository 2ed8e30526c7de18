"""``/tokenize`` and ``/detokenize`` (vLLM's endpoints): the token ids this server reads a prompt or a conversation
as, and the text of token ids.

Rules:
- ``/tokenize`` takes ``prompt`` (a string, read as ``/v1/completions`` reads one, and ``""`` too, which completions
  refuse; ``add_special_tokens`` false: without the tokenizer's special tokens) or ``messages`` (as
  ``/v1/chat/completions`` reads them, through the chat template, with ``tools`` unless ``tool_choice`` is none, and
  ``chat_template_kwargs`` over the server's), and answers ``count``, ``max_model_len`` and ``tokens``, and
  ``token_strs`` with ``return_token_strs``.
- ``/detokenize`` takes ``tokens`` (ids of the vocabulary) and answers ``prompt``: their text, special tokens
  included.
- ``model`` is checked as on the other endpoints. Any other field is a 400, and so is a chat template option this
  server does not take (``add_generation_prompt`` false, ``continue_final_message``), or ``add_special_tokens`` with
  messages (a conversation's special tokens are its template's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quickdraft.api import Pipeline
from quickdraft.errors import QuickdraftError
from quickdraft.lossless.sampling import is_int
from quickdraft.prompts import require_utf8
from quickdraft.server.errors import ApiError
from quickdraft.server.fields import flag
from quickdraft.server.messages import chat_messages
from quickdraft.server.protocol import served_model, template_kwargs
from quickdraft.server.tool_formats import ToolFormat
from quickdraft.server.tools import parse_tools

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "tools", "tool_choice", "parallel_tool_calls",
                             "add_special_tokens", "return_token_strs", "add_generation_prompt",
                             "continue_final_message", "chat_template_kwargs"})  # fmt: skip


def tokenize(
    body: Any,
    pipeline: Pipeline,
    model_names: tuple[str, ...],
    tool_format: ToolFormat | None,
    spell: Callable[[int], tuple[str, bytes]],
    template_defaults: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The answer to a ``/tokenize`` body (the rules above); raises :class:`ApiError`."""
    _check(body, TOKENIZE_FIELDS, model_names)
    if (body.get("prompt") is None) == (body.get("messages") is None):
        raise ApiError(400, "give a prompt or messages", "prompt")
    if body.get("messages") is not None:
        if not flag(body, "add_generation_prompt", True) or flag(body, "continue_final_message", False):
            message = "this server reads a conversation as the assistant's next turn: add_generation_prompt true only"
            field = "continue_final_message" if flag(body, "continue_final_message", False) else "add_generation_prompt"
            raise ApiError(400, message + ", continue_final_message false", field, code="unsupported_parameter")
        if body.get("add_special_tokens") is not None:
            message = "add_special_tokens applies to a prompt: a conversation's are its chat template's"
            raise ApiError(400, message, "add_special_tokens", code="unsupported_parameter")
    try:
        if body.get("messages") is not None:
            tools = parse_tools(body, tool_format)
            tools_list = None if tools is None else list(tools.tools)
            messages = chat_messages(body, tool_format, answered=False)  # a call's tokens counted before it runs
            ids = pipeline.encode_chat(messages, tools_list, template_kwargs(body, template_defaults))
        else:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise ApiError(400, "prompt must be a string", "prompt")
            require_utf8(prompt, "the prompt")
            special = flag(body, "add_special_tokens", True)
            ids = list(pipeline.tokenizer(prompt, add_special_tokens=special).input_ids)  # "": [bos] where it has one
    except QuickdraftError as error:  # a template that cannot render them, text that is not UTF-8
        field = getattr(error, "setting", None) or ("messages" if body.get("messages") is not None else "prompt")
        raise ApiError(400, str(error), field) from None
    answer = {"count": len(ids), "max_model_len": pipeline.target.max_context, "tokens": ids}
    return answer | ({"token_strs": [spell(i)[0] for i in ids]} if flag(body, "return_token_strs", False) else {})


def detokenize(body: Any, pipeline: Pipeline, model_names: tuple[str, ...]) -> dict[str, Any]:
    """The answer to a ``/detokenize`` body (the rules above); raises :class:`ApiError`."""
    _check(body, frozenset({"model", "tokens"}), model_names)
    tokens, vocab_size = body.get("tokens"), pipeline.target.vocab_size
    if not isinstance(tokens, list) or not all(is_int(token) and 0 <= token < vocab_size for token in tokens):
        raise ApiError(400, f"tokens must be a list of token ids in [0, {vocab_size})", "tokens")
    return {"prompt": pipeline.tokenizer.decode(tokens)}


def _check(body: Any, fields: frozenset[str], model_names: tuple[str, ...]) -> None:
    for name in body:
        if name not in fields and body[name] is not None:
            raise ApiError(400, f"unrecognized request argument: {name}", name, code="unrecognized_parameter")
    served_model(body, model_names)

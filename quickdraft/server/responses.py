"""The OpenAI wire format, responses: a whole completion or chat completion, its streamed chunks, the usage and
the log-probabilities, for an :class:`ApiRequest` (:mod:`quickdraft.server.protocol`) and its result."""

from __future__ import annotations

import codecs
import difflib
import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from quickdraft.engine import GenerationResult
from quickdraft.engine.logprobs import TokenLogprob
from quickdraft.server.protocol import ApiRequest


def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def finish_reason(reason: str) -> str:
    """Ours (eos, stop, length; tool_calls for an answer that called tools) as OpenAI's: the model's end and a
    stop string are both "stop"."""
    return reason if reason in ("length", "tool_calls") else "stop"


def usage(api: ApiRequest, results: Sequence[GenerationResult]) -> dict[str, Any]:
    """Token counts (the prompt once, every choice's tokens); with a prediction, OpenAI's
    ``completion_tokens_details``: the prediction's tokens that appear in each answer (matched in order) and those
    that do not, over the choices."""
    prompt_tokens, completion_tokens = len(api.serve.prompt_ids), sum(len(result.token_ids) for result in results)
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": results[0].stats.cached_prompt_tokens},
    }
    if api.serve.prediction_ids:
        appeared = 0
        for result in results:
            matcher = difflib.SequenceMatcher(None, api.serve.prediction_ids, result.token_ids, autojunk=False)
            appeared += sum(block.size for block in matcher.get_matching_blocks())
        body["completion_tokens_details"] = {
            "accepted_prediction_tokens": appeared,
            "rejected_prediction_tokens": len(api.serve.prediction_ids) * len(results) - appeared,
        }
    return body


class TextOffsets:
    """Where each of a choice's tokens starts in its text (completions' ``text_offset``), from ``start``: the tokens'
    own bytes read as UTF-8 one after another, so a token inside a character (its text U+FFFD) and the one that
    completes it both point at that character; a character begun but not completed is one U+FFFD of the text, as a
    byte-level tokenizer decodes it, before the token that breaks it off. A token of ``silent`` (a special token the
    text leaves out) takes no characters: it points where the next one starts."""

    def __init__(self, start: int = 0, silent: frozenset[int] = frozenset()) -> None:
        self.at = start
        self.silent = silent
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds a character's first bytes

    def of(self, pieces: Sequence[tuple[int, bytes]]) -> list[int]:
        """The offsets of the next tokens, by their ids and bytes."""
        offsets = []
        for token_id, data in pieces:
            if token_id in self.silent:
                offsets.append(self.at)
                continue
            begun = self._utf8.getstate()[0]  # a character's first bytes, read before
            broken = bool(begun) and not (data and 0x80 <= data[0] <= 0xBF)  # not continued: U+FFFD before it
            offsets.append(self.at + broken)
            self.at += len(self._utf8.decode(data))
        return offsets


def logprobs_body(
    api: ApiRequest,
    logprobs: Sequence[TokenLogprob],
    spell: Callable[[int], tuple[str, bytes]],
    offsets: TextOffsets | None = None,
) -> dict[str, Any] | None:
    """A choice's ``logprobs`` in OpenAI's shape for chat (``content``: token, logprob, bytes, top_logprobs) or
    completions (tokens, token_logprobs, top_logprobs with the sampled token among them, text_offset by ``offsets``:
    from 0 without); None when not asked for.
    ``spell(id)``: a token's text and its bytes (a token that is part of a UTF-8 character reads as U+FFFD, its
    bytes are its own). Alternatives with probability 0 (excluded by top-k or top-p) are not among them: the
    engine's ``token_logprobs`` leaves them out."""
    if api.serve.config.logprobs is None:
        return None
    spelled = [spell(entry.token_id) for entry in logprobs]
    tops = [[(spell(token), value) for token, value in entry.top] for entry in logprobs]
    if api.chat:
        return {
            "refusal": None,
            "content": [
                {
                    "token": text,
                    "logprob": entry.logprob,
                    "bytes": list(data),
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": list(b)} for (t, b), v in top],
                }
                for (text, data), entry, top in zip(spelled, logprobs, tops, strict=True)
            ],
        }
    return {
        "tokens": [text for text, _ in spelled],
        "token_logprobs": [entry.logprob for entry in logprobs],
        "top_logprobs": [
            {text: value for (text, _), value in top} | _sampled(text, entry.logprob, top)
            for (text, _), entry, top in zip(spelled, logprobs, tops, strict=True)
        ],
        "text_offset": (offsets or TextOffsets()).of(
            [(entry.token_id, data) for entry, (_, data) in zip(logprobs, spelled, strict=True)]
        ),
    }


def _sampled(text: str, logprob: float, top: list[tuple[tuple[str, bytes], float]]) -> dict[str, float]:
    """A completion's sampled token among its alternatives, where they leave it out (OpenAI always shows it: up to
    ``logprobs`` + 1 of them)."""
    return {} if not math.isfinite(logprob) or any(spelled == text for (spelled, _), _ in top) else {text: logprob}


def prompt_logprobs_body(
    api: ApiRequest, prompt_logprobs: Sequence[TokenLogprob], spell: Callable[[int], tuple[str, bytes]]
) -> dict[str, Any]:
    """An echoed prompt's part of a completion's ``logprobs``: its tokens, each one's log-probability and likeliest
    alternatives at its position, none for the first (nothing comes before it), offsets from 0 into the echoed text
    (:class:`TextOffsets`; start tokens it does not spell, a BOS, take no characters; nor does the space before its
    first word, which the text drops)."""
    after = logprobs_body(api, prompt_logprobs, spell) or {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    tokens, echo, counter = [spell(api.serve.prompt_ids[0])[0], *after["tokens"]], api.echo or "", TextOffsets()
    offsets = []
    for token_id, token in zip(api.serve.prompt_ids, tokens, strict=True):
        data = spell(token_id)[1]
        if not counter.at and not echo.startswith(token) and "\ufffd" not in token:  # a start token, a dropped space
            data = data[1:] if token.startswith(" ") and echo.startswith(token[1:]) else b""
        offsets += counter.of([(token_id, data)])
    return {
        "tokens": tokens,
        "token_logprobs": [None, *after["token_logprobs"]],
        "top_logprobs": [None, *after["top_logprobs"]],
        "text_offset": offsets,
    }


def completion_logprobs(
    api: ApiRequest, result: GenerationResult, spell: Callable[[int], tuple[str, bytes]]
) -> dict[str, Any] | None:
    """A completion choice's ``logprobs``: the answer's, after the echoed prompt's where it echoes."""
    answer = logprobs_body(api, result.logprobs or [], spell, TextOffsets(len(api.echo or ""), api.silent))
    if answer is None or api.echo is None:
        return answer
    prompt = prompt_logprobs_body(api, result.prompt_logprobs or [], spell)
    return {key: prompt[key] + answer[key] for key in answer}


def response_body(
    api: ApiRequest, response_id: str, results: Sequence[GenerationResult], spell: Callable[[int], tuple[str, bytes]]
) -> dict[str, Any]:
    """A whole (non-streamed) completion or chat completion: a choice per result."""
    return {
        "id": response_id,
        "object": "chat.completion" if api.chat else "text_completion",
        "created": api.created,
        "model": api.model,
        "system_fingerprint": None,
        "choices": [choice_body(api, index, result, spell) for index, result in enumerate(results)],
        "usage": usage(api, results),
        "speculation": speculation(results),
    }


SUMMED = ("usage", "speculation")  # an answer's counts


def batch_body(bodies: Sequence[dict[str, Any]], n: int) -> dict[str, Any]:
    """One answer of a completion of several prompts from each prompt's (``response_body``): their choices in order,
    choice j of prompt i at index i·n + j; usage and speculation summed over the prompts."""
    choices = [
        {**choice, "index": i * n + choice["index"]} for i, body in enumerate(bodies) for choice in body["choices"]
    ]
    return {**bodies[0], "choices": choices} | {key: _summed([body[key] for body in bodies]) for key in SUMMED}


def _summed(counts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts (nested: ``prompt_tokens_details``) added up key by key."""
    return {
        key: _summed([part[key] for part in counts]) if isinstance(value, dict) else sum(part[key] for part in counts)
        for key, value in counts[0].items()
    }


def choice_body(
    api: ApiRequest, index: int, result: GenerationResult, spell: Callable[[int], tuple[str, bytes]]
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason(result.finish_reason)}
    choice["stop_reason"] = result.stop_reason  # vLLM's: the stop string or token that ended it
    choice["logprobs"] = (
        logprobs_body(api, result.logprobs or [], spell) if api.chat else completion_logprobs(api, result, spell)
    )
    reasoning, text = api.thinking.split(result.text) if api.thinking else (None, result.text)
    content, calls = api.tools.split_calls(text) if api.tools else (text, [])
    if api.chat:
        no_text = calls or reasoning is not None or (api.tools and api.tools.only_calls)  # it thought: null, as vLLM
        choice["message"] = {"role": "assistant", "content": (content or None) if no_text else content}
        if reasoning is not None:
            choice["message"]["reasoning_content"] = reasoning
        if calls:
            choice["message"]["tool_calls"] = calls
        if api.tools:
            choice["finish_reason"] = finish_reason(api.tools.finish_reason(result.finish_reason, bool(calls)))
    else:
        choice["text"] = (api.echo or "") + result.text
    if api.return_token_ids:
        choice["token_ids"] = result.token_ids
    return choice


def speculation(results: Sequence[GenerationResult]) -> dict[str, int]:
    """The answer's drafts proposed and accepted, over its choices (quickdraft's field beside OpenAI's ``usage``)."""
    return {
        "drafts_proposed": sum(result.stats.draft_tokens_proposed for result in results),
        "drafts_accepted": sum(result.stats.draft_tokens_accepted for result in results),
    }


def chunk_body(
    api: ApiRequest,
    response_id: str,
    text: str | None,
    token_ids: tuple[int, ...] = (),
    reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    index: int = 0,
    reasoning: str = "",
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    """One streamed chunk of choice ``index``: a text delta (None: the chat's opening role delta), or the end with
    ``reason``; ``logprobs``: the delta's tokens' (:func:`logprobs_body`); ``tool_calls``: the answer's calls,
    whole; ``reasoning``: a reasoning delta (``reasoning_content``); ``stop_reason``: vLLM's, with the end."""
    choice: dict[str, Any] = {"index": index, "finish_reason": None if reason is None else finish_reason(reason)}
    choice["stop_reason"] = stop_reason
    if api.chat:
        choice["delta"] = {"role": "assistant", "content": ""} if text is None else ({"content": text} if text else {})
        if reasoning:
            choice["delta"]["reasoning_content"] = reasoning
        if tool_calls:
            choice["delta"]["tool_calls"] = [{"index": i} | call for i, call in enumerate(tool_calls)]
    else:
        choice["text"] = text or ""
    choice["logprobs"] = logprobs
    if api.return_token_ids:
        choice["token_ids"] = list(token_ids)
    kind = "chat.completion.chunk" if api.chat else "text_completion"
    body = {"id": response_id, "object": kind, "created": api.created, "model": api.model, "system_fingerprint": None}
    return body | {"choices": [choice]} | ({"usage": None} if api.include_usage else {})  # usage: on the last chunk


def usage_chunk(parts: Sequence[tuple[ApiRequest, Sequence[GenerationResult]]], response_id: str) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage`` is set: no choices, the usage and the speculation of
    ``parts`` (the request and its results, or each prompt's of a completion of several), summed."""
    counts = [{"usage": usage(api, results), "speculation": speculation(results)} for api, results in parts]
    summed = {key: _summed([part[key] for part in counts]) for key in SUMMED}
    return chunk_body(parts[0][0], response_id, "") | {"choices": []} | summed

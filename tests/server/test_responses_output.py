"""The Responses API's answer apart from the server: a streamed answer's events end with the whole answer's output
and usage, whatever the answer (reasoning, text, calls, empty tokens), its split into tokens and into deltas, every
event of OpenAI's shape and in order; a reasoning split inside a character stays out of the message's
log-probabilities."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from quickdraft.engine import GenerationResult, RequestFinished, TokenDelta
from quickdraft.engine.logprobs import TokenLogprob
from quickdraft.prompts import THINK_TAGS
from quickdraft.server import responses_output
from quickdraft.server.reasoning import Thinking
from quickdraft.server.responses_api import Echo
from quickdraft.server.tool_formats import HERMES
from quickdraft.server.tools import ToolRequest
from quickdraft.stats import GenerationStats

ECHO = Echo(None, None, [], "auto", True, {"format": {"type": "text"}}, None, {})
PIECES = ["<think>", "</think>", "<tool_call>", '{"name": "f", "arguments": {}}', "</tool_call>", " ", "\n", "a",
          "<", "/", "think", ">", "{", "</th", "ink>", "é"]  # fmt: skip


class Vocabulary:
    """Token ids for token texts; a text of one byte of a two-byte character reads as U+FFFD, as the server's."""

    def __init__(self, spelled: dict[str, bytes] | None = None) -> None:
        self.ids: dict[str, int] = {}
        self.spelled = spelled or {}

    def id(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids))

    def spell(self, token: int) -> tuple[str, bytes]:
        text = next(text for text, number in self.ids.items() if number == token)
        return ("\ufffd", self.spelled[text]) if text in self.spelled else (text, text.encode())


def api_for(thinking: Thinking | None, tools: bool) -> Any:
    """What the answer's functions read of a request (duck-typed: a chat request asking for log-probabilities)."""
    call = ToolRequest(({"type": "function", "function": {"name": "f", "parameters": {}}},), "auto",
                       frozenset({"f"}), HERMES) if tools else None  # fmt: skip
    config = SimpleNamespace(logprobs=0, sampling=SimpleNamespace(temperature=0.0, top_p=1.0), grammar=None)
    serve = SimpleNamespace(config=config, prompt_ids=[1, 2, 3])
    return SimpleNamespace(serve=serve, chat=True, tools=call, thinking=thinking, model="m", created=0)


class Track:
    def seconds_left(self) -> float:
        return 5.0


def answer(vocabulary: Vocabulary, tokens: list[str], deltas: list[tuple[str, list[str]]], finish: str) -> list[Any]:
    """The engine's events: each delta's text with its tokens' log-probabilities, then the finished answer."""
    entry = lambda text: TokenLogprob(vocabulary.id(text), -0.5, ())  # noqa: E731
    events: list[Any] = [TokenDelta(text, tuple(vocabulary.id(t) for t in group), tuple(entry(t) for t in group))
                         for text, group in deltas]  # fmt: skip
    text = "".join(text for text, _ in deltas)
    ids = [vocabulary.id(t) for t in tokens]
    result = GenerationResult(text, ids, finish, GenerationStats(), [entry(t) for t in tokens])
    return [*events, RequestFinished(result)]


def streamed(api: Any, events: list[Any], vocabulary: Vocabulary) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        for event in events:
            queue.put_nowait((0, event))
        sent = responses_output.stream_events(api, ECHO, queue, Track(), vocabulary.spell)
        return [json.loads(text.split("data: ", 1)[1]) async for text in sent]

    return asyncio.run(run())


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in item.items() if key not in ("id", "call_id")} for item in items]


def test_streamed_answers_end_with_the_whole_answers_output() -> None:
    generator, events_of = random.Random(0), TypeAdapter(ResponseStreamEvent)
    for _ in range(400):
        text = "".join(generator.choice(PIECES) for _ in range(generator.randint(0, 8)))
        cuts = sorted(generator.sample(range(1, len(text)), min(max(len(text) - 1, 0), generator.randint(0, 10))))
        tokens = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)] if text else []
        for _ in range(generator.randint(0, 2)):
            tokens.insert(generator.randint(0, len(tokens)), "")  # tokens that spell nothing
        deltas, start = [], 0
        while start < len(tokens):
            group = tokens[start : start + generator.randint(1, 3)]
            deltas.append(("".join(group), group))
            start += len(group)
        thinking = generator.choice([None, Thinking(False, THINK_TAGS[0]), Thinking(True, THINK_TAGS[0])])
        api, vocabulary = api_for(thinking, generator.random() < 0.5), Vocabulary()
        events = answer(vocabulary, tokens, deltas, generator.choice(["eos", "length"]))
        result = events[-1].result
        whole = responses_output.output_items(api, result, vocabulary.spell)
        expected = responses_output.response_object(api, ECHO, "resp_1", whole, result, spell=vocabulary.spell)
        sent = streamed(api, events, vocabulary)
        assert [event["sequence_number"] for event in sent] == list(range(len(sent)))
        for event in sent:
            events_of.validate_python(event)
        final = Response.model_validate(sent[-1]["response"]).model_dump(mode="json", exclude_none=True)
        assert without_ids(sent[-1]["response"]["output"]) == without_ids(whole), (text, tokens, thinking)
        assert sent[-1]["response"]["usage"] == expected["usage"] and final["status"] == expected["status"]
        message = [item for item in whole if item["type"] == "message"]
        deltas_logprobs = [entry for event in sent if event["type"] == "response.output_text.delta"
                           for entry in event["logprobs"]]  # fmt: skip
        entries = message[0]["content"][0]["logprobs"] if message else []
        assert deltas_logprobs == entries[: len(deltas_logprobs)]  # sent with the text they spell
        assert all(entry["token"] == "" for entry in entries[len(deltas_logprobs) :])  # none left: no delta came


def test_a_character_split_into_tokens_stays_in_the_reasoning() -> None:
    """é as two one-byte tokens (each reading U+FFFD): the message's log-probabilities are its own token's, and
    the reasoning's five tokens count as reasoning, whole and streamed."""
    vocabulary = Vocabulary({"e1": b"\xc3", "e2": b"\xa9"})
    tokens = ["<think>", "e1", "e2", "</think>", "\n\n", "ok"]
    deltas = [("<think>", ["<think>"]), ("", ["e1"]), ("é", ["e2"]), ("</think>\n\nok", ["</think>", "\n\n", "ok"])]
    events = answer(vocabulary, tokens, deltas, "eos")
    result = events[-1].result
    api = api_for(Thinking(False, THINK_TAGS[0]), False)
    for output in (responses_output.output_items(api, result, vocabulary.spell),
                   streamed(api, events, vocabulary)[-1]["response"]["output"]):  # fmt: skip
        assert [item["type"] for item in output] == ["reasoning", "message"]
        assert output[0]["content"][0]["text"] == "é"
        assert [entry["token"] for entry in output[1]["content"][0]["logprobs"]] == ["ok"]
    usage = responses_output.usage(api, result, vocabulary.spell)
    assert usage["output_tokens_details"]["reasoning_tokens"] == 5


def test_a_character_split_into_tokens_goes_out_with_the_delta_that_spells_it() -> None:
    """🍕 as a token of a space and its first two bytes, then two one-byte tokens (each reading U+FFFD): each delta
    carries the entries of the tokens it spells, measured in bytes (counting a U+FFFD as one character held the
    last entries back to the end), and a call after the text leaves the text's entries whole."""
    vocabulary = Vocabulary({"p1": b" \xf0\x9f", "p2": b"\x8d", "p3": b"\x95"})
    tokens = ["Hi", "p1", "p2", "p3", " ok"]
    deltas = [("Hi", ["Hi"]), ("", ["p1"]), ("", ["p2"]), (" \U0001f355", ["p3"]), (" ok", [" ok"])]
    events = answer(vocabulary, tokens, deltas, "eos")
    sent = streamed(api_for(None, False), events, vocabulary)
    per_delta = [[entry["bytes"] for entry in event["logprobs"]] for event in sent
                 if event["type"] == "response.output_text.delta"]  # fmt: skip
    assert per_delta == [[list(b"Hi")], [list(b" \xf0\x9f"), [0x8D], [0x95]], [list(b" ok")]]
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    events = answer(vocabulary, [*tokens, call], [*deltas, (call, [call])], "eos")
    api = api_for(None, True)
    for output in (responses_output.output_items(api, events[-1].result, vocabulary.spell),
                   streamed(api, events, vocabulary)[-1]["response"]["output"]):  # fmt: skip
        assert [item["type"] for item in output] == ["message", "function_call"]
        assert len(output[0]["content"][0]["logprobs"]) == 5  # all of the text's tokens, none of the call's


def test_bytes_that_are_no_utf8_count_as_the_texts_u_fffd() -> None:
    """A lone first byte of a character, then an ASCII token: the text holds one U+FFFD (three bytes in UTF-8) for
    the token's one byte. The reasoning's tokens stay the reasoning's and the calls' stay out of the message,
    whole and streamed."""
    vocabulary = Vocabulary({"x1": b"\xc3"})
    tokens = ["<think>", "x1", "a", "</think>", "\n\n", "ok"]
    deltas = [("<think>", ["<think>"]), ("", ["x1"]), ("\ufffda", ["a"]), ("</think>\n\nok", tokens[3:])]
    events = answer(vocabulary, tokens, deltas, "eos")
    api = api_for(Thinking(False, THINK_TAGS[0]), False)
    for output in (responses_output.output_items(api, events[-1].result, vocabulary.spell),
                   streamed(api, events, vocabulary)[-1]["response"]["output"]):  # fmt: skip
        assert output[0]["content"][0]["text"] == "\ufffda"
        assert [entry["token"] for entry in output[1]["content"][0]["logprobs"]] == ["ok"]
    assert responses_output.usage(api, events[-1].result, vocabulary.spell)["output_tokens_details"] == {
        "reasoning_tokens": 5
    }
    call = ["<", 'tool_call>{"name": "f", "arguments": {}}', "</tool_call>"]
    tokens = ["Hi", "x1", "a", *call]
    deltas = [("Hi", ["Hi"]), ("", ["x1"]), ("\ufffda", ["a"]), *((token, [token]) for token in call)]
    events = answer(vocabulary, tokens, deltas, "eos")
    api = api_for(None, True)
    for output in (responses_output.output_items(api, events[-1].result, vocabulary.spell),
                   streamed(api, events, vocabulary)[-1]["response"]["output"]):  # fmt: skip
        assert [item["type"] for item in output] == ["message", "function_call"]
        assert [entry["bytes"] for entry in output[0]["content"][0]["logprobs"]] == [list(b"Hi"), [0xC3], [0x61]]

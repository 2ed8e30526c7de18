"""A thinking model's reasoning apart from its content: the split of a whole answer, the same split streamed over
any chunking, and both through the server (``--reasoning-format``), with tools looked for in the content only."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
from conftest import MODEL, Server, serving
from test_tools import TIME, char_pipeline

from quickdraft.server.reasoning import Thinking, opened_by, thinking_of

# a template whose model thinks: the assistant's turn opens a think block when asked (as DeepSeek-R1's always does)
THINKING = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if tools %}<tool_call> {% endif %}assistant: {% if open_think %}<think>\n{% endif %}"
    "{# earlier answers drop their <think>...</think> #}"
)


def test_a_whole_answer_splits_at_the_closing_tag() -> None:
    own, opened = Thinking(False), Thinking(True)
    assert own.split("<think>\nhmm\n</think>\n\nParis.") == ("\nhmm\n", "Paris.")
    assert own.split("  <think>still thinking") == ("still thinking", "")  # cut short while thinking
    assert own.split("Paris. <think>x</think>") == (None, "Paris. <think>x</think>")  # not at the start: text
    assert opened.split("hmm</think>  Paris.") == ("hmm", "Paris.") and opened.split("hmm") == ("hmm", "")
    assert opened_by("user: hi\nassistant: <think>\n") and not opened_by("<think>\n\n</think>\n\nassistant: ")
    assert thinking_of("{{ '<think>' }} ... {{ '</think>' }}") and not thinking_of("<tool_call>")


def test_a_streamed_answer_splits_as_the_whole_one() -> None:
    answers = ["<think>\nhmm\n</think>\n\nParis.", "  <think>cut", "Paris.", "", " ", "<thi", "<think></think>",
               "<think>a</thin", "<think>a</think>", "<think>a</think>   ", "hmm</think>ok", "x <think>y</think>",
               "<think>a</think></think>b", "\n<think>\n<think>a</think>b"]  # fmt: skip
    generator = random.Random(0)
    for opened in (False, True):
        thinking = Thinking(opened)
        for answer in answers:
            whole_reasoning, whole_content = thinking.split(answer)
            for _ in range(30):
                stream, reasoning, content, start = thinking.stream(), "", "", 0
                while start < len(answer):
                    end = start + generator.randint(1, 4)
                    more_reasoning, more_content = stream.feed(answer[start:end])
                    reasoning, content, start = reasoning + more_reasoning, content + more_content, end
                last_reasoning, last_content = stream.finish()
                reasoning, content = reasoning + last_reasoning, content + last_content
                assert (reasoning, content) == (whole_reasoning or "", whole_content), (opened, answer)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    with serving(char_pipeline(THINKING)) as split, serving(char_pipeline(THINKING), split_reasoning=False) as whole:
        yield split, whole


@pytest.mark.parametrize("opened", [False, True])
def test_the_server_gives_reasoning_apart_whole_and_streamed(servers: tuple[Server, Server], opened: bool) -> None:
    split, whole = servers
    answer = "<think>abc</think> ok" if not opened else "abc</think> ok"
    fields = {"regex": answer.replace("<", "\\<"), "chat_template_kwargs": {"open_think": opened}}
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0}

    def create(server: Server, **more: object) -> object:
        return server.client().chat.completions.create(**ask, extra_body=fields, **more)  # type: ignore[arg-type]

    message = create(split).choices[0].message  # type: ignore[attr-defined]
    assert (message.reasoning_content, message.content) == ("abc", "ok")
    chunks = [chunk.choices[0].delta for chunk in create(split, stream=True) if chunk.choices]  # type: ignore[attr-defined]
    streamed = [
        "".join(getattr(delta, key, None) or "" for delta in chunks) for key in ("reasoning_content", "content")
    ]
    assert streamed == ["abc", "ok"]
    plain = create(whole).choices[0].message  # type: ignore[attr-defined]
    assert plain.content == answer and getattr(plain, "reasoning_content", None) is None


def test_tools_are_looked_for_after_the_reasoning(servers: tuple[Server, Server]) -> None:
    call = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    regex = "\\<think\\>why\\</think\\>" + call.replace("{", "\\{").replace("}", "\\}").replace("<", "\\<")
    response = servers[0].client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[TIME], max_tokens=80, temperature=0,
        extra_body={"regex": regex},
    )  # fmt: skip
    message = response.choices[0].message
    assert message.reasoning_content == "why" and message.tool_calls[0].function.name == "get_time"
    assert json.loads(message.tool_calls[0].function.arguments) == {} and not message.content

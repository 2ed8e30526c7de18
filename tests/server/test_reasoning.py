"""A thinking model's reasoning apart from its content: the split of a whole answer, the same split streamed over
any chunking, and both through the server (``--reasoning-format``), with tools looked for in the content only; the
Responses API's reasoning items, out and in."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, serving
from test_tools import TIME, char_pipeline

from quickdraft.prompts import THINK_TAGS, generation_prompt, thinking_of
from quickdraft.server.errors import ApiError
from quickdraft.server.reasoning import Thinking, opened_by

# a template whose model thinks: the assistant's turn opens a think block when asked (as DeepSeek-R1's always does)
THINKING = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if tools %}<tool_call> {% endif %}{% if add_generation_prompt %}assistant: "
    "{% if open_think %}<think>\n{% endif %}{% endif %}"
    "{# earlier answers drop their <think>...</think> #}"
)


def test_a_whole_answer_splits_at_the_closing_tag() -> None:
    own, opened = Thinking(False, THINK_TAGS[0]), Thinking(True, THINK_TAGS[0])
    assert own.split("<think>\nhmm\n</think>\n\nParis.") == ("\nhmm\n", "Paris.")
    assert own.split("  <think>still thinking") == ("still thinking", "")  # cut short while thinking
    assert own.split("Paris. <think>x</think>") == (None, "Paris. <think>x</think>")  # not at the start: text
    assert opened.split("hmm</think>  Paris.") == ("hmm", "Paris.") and opened.split("hmm") == ("hmm", "")
    assert opened_by("user: hi\nassistant: <think>\n", THINK_TAGS[0]) and not opened_by(
        "<think>\n\n</think>\n\nassistant: ", THINK_TAGS[0]
    )
    assert thinking_of("{{ '<think>' }} ... {{ '</think>' }}") == THINK_TAGS[0] and not thinking_of("<tool_call>")
    magistral = Thinking(False, thinking_of("[THINK] ... [/THINK]"))  # type: ignore[arg-type]
    assert magistral.split("[THINK]hmm[/THINK]\nParis.") == ("hmm", "Paris.")
    assert magistral.split("<think>x</think>y") == (None, "<think>x</think>y")  # another family's tags are text
    assert opened_by("[INST]hi[/INST][THINK]", THINK_TAGS[1]) and not opened_by("[INST]hi[/INST][THINK]", THINK_TAGS[0])


def test_a_streamed_answer_splits_as_the_whole_one() -> None:
    answers = ["<think>\nhmm\n</think>\n\nParis.", "  <think>cut", "Paris.", "", " ", "<thi", "<think></think>",
               "<think>a</thin", "<think>a</think>", "<think>a</think>   ", "hmm</think>ok", "x <think>y</think>",
               "<think>a</think></think>b", "\n<think>\n<think>a</think>b"]  # fmt: skip
    generator = random.Random(0)
    brackets = [answer.replace("</think>", "[/THINK]").replace("<think>", "[THINK]").replace("<thi", "[THI")
                for answer in answers]  # fmt: skip
    for opened, (tags, told) in itertools.product((False, True), zip(THINK_TAGS, (answers, brackets), strict=True)):
        thinking = Thinking(opened, tags)
        for answer in told:
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


def test_the_server_gives_reasoning_apart_whole_and_streamed(servers: tuple[Server, Server]) -> None:
    split, whole = servers
    answer = "<think>abc</think> ok"
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0}

    def create(server: Server, **more: object) -> object:
        return server.client().chat.completions.create(
            **ask, extra_body={"regex": "\\<think\\>abc\\</think\\> ok"}, **more
        )  # type: ignore[arg-type]

    message = create(split).choices[0].message  # type: ignore[attr-defined]
    assert (message.reasoning_content, message.content) == ("abc", "ok")
    chunks = [chunk.choices[0].delta for chunk in create(split, stream=True) if chunk.choices]  # type: ignore[attr-defined]
    streamed = [
        "".join(getattr(delta, key, None) or "" for delta in chunks) for key in ("reasoning_content", "content")
    ]
    assert streamed == ["abc", "ok"]
    plain = create(whole).choices[0].message  # type: ignore[attr-defined]
    assert plain.content == answer and getattr(plain, "reasoning_content", None) is None


def test_an_answer_thinks_from_a_block_its_template_opened_unless_a_grammar_holds_it(
    servers: tuple[Server, Server],
) -> None:
    """The template's opening of the assistant's turn decides, not the user's text (which may mention <think>);
    under a grammar the block could never close, so the answer is content."""
    client = servers[0].client()
    opened = {"chat_template_kwargs": {"open_think": True}}
    ask = {"model": MODEL, "max_tokens": 20, "temperature": 0}
    free = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], extra_body=opened, **ask)
    message = free.choices[0].message
    assert message.reasoning_content and "</think>" not in message.reasoning_content and message.content is None
    held = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], extra_body=opened | {"regex": '\\{"a": 7\\}'}, **ask
    )
    assert (
        held.choices[0].message.content == '{"a": 7}'
        and getattr(held.choices[0].message, "reasoning_content", None) is None
    )
    strict = {**TIME, "function": {**TIME["function"], "strict": True}}  # a lazy grammar: any text until a call
    lazy = client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], tools=[strict], extra_body=opened, **ask
    )
    assert lazy.choices[0].message.reasoning_content and lazy.choices[0].message.content is None
    mention = client.chat.completions.create(messages=[{"role": "user", "content": "what is <think>"}], **ask)
    assert getattr(mention.choices[0].message, "reasoning_content", None) is None and mention.choices[0].message.content


def test_an_answer_that_thought_and_wrote_nothing_after_has_null_content(servers: tuple[Server, Server]) -> None:
    """Cut short while thinking, or ended right after it, even with nothing inside the block: content is null."""
    client = servers[0].client()
    for regex, reasoning in (("\\<think\\>", ""), ("\\<think\\>\\</think\\>", ""), ("\\<think\\>a", "a")):
        message = (
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20, extra_body={"regex": regex}
            )
            .choices[0]
            .message
        )
        assert message.content is None and message.reasoning_content == reasoning, regex


def test_the_template_says_where_an_answer_starts() -> None:
    pipeline = char_pipeline(THINKING)
    assert generation_prompt(pipeline.tokenizer) == "assistant: "
    assert opened_by(generation_prompt(pipeline.tokenizer, {"open_think": True}), THINK_TAGS[0])
    assert generation_prompt(pipeline.tokenizer, {"add_generation_prompt": True}) == ""  # refused: no opening known


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


def test_the_responses_api_gives_reasoning_as_an_item_whole_and_streamed(servers: tuple[Server, Server]) -> None:
    """A reasoning item before the message, with the message's log-probabilities its own tokens', the reasoning's
    tokens counted; streamed, the same output through OpenAI's reasoning events, every event of OpenAI's shape."""
    from test_responses_api import raw_events, strictly

    split, whole = servers
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 40, "temperature": 0,
            "include": ["message.output_text.logprobs"]}  # fmt: skip
    cases = [("\\<think\\>abc\\</think\\> ok", ["reasoning", "message"], "abc", "ok"),
             ("\\<think\\>abc", ["reasoning"], "abc", None), ("ok", ["message"], None, "ok")]  # fmt: skip
    for regex, kinds, reasoning, text in cases:
        asked = body | {"regex": regex}
        answer = strictly(httpx.post(f"{split.url}/v1/responses", json=asked, timeout=TIMEOUT).json())
        events = raw_events(split, asked)
        final = strictly(events[-1]["response"])
        for output in (answer["output"], final["output"]):
            assert [item["type"] for item in output] == kinds, (regex, output)
            found = {item["type"]: item for item in output}
            if reasoning is not None:
                assert found["reasoning"]["content"] == [{"type": "reasoning_text", "text": reasoning}]
            if text is not None:
                part = found["message"]["content"][0]
                assert part["text"] == text and "".join(entry["token"] for entry in part["logprobs"]) == text
        streamed = "".join(event["delta"] for event in events if event["type"] == "response.reasoning_text.delta")
        assert streamed == (reasoning or "")
        spelled_reasoning = len(regex.replace("\\", "")) - len(text or "")  # one token a character here
        for usage in (answer["usage"], final["usage"]):
            assert usage["output_tokens_details"]["reasoning_tokens"] == (spelled_reasoning if reasoning else 0)
        indices = [event["output_index"] for event in events if event["type"] == "response.output_item.added"]
        assert indices == list(range(len(kinds)))
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
    opened = strictly(httpx.post(f"{split.url}/v1/responses", timeout=TIMEOUT,
                                 json=body | {"chat_template_kwargs": {"open_think": True}}).json())  # fmt: skip
    assert opened["output"][0]["type"] == "reasoning"  # the template opened the block: the answer thinks from its start
    kept = strictly(httpx.post(f"{whole.url}/v1/responses", json=body | {"regex": cases[0][0]}, timeout=TIMEOUT).json())
    assert [item["type"] for item in kept["output"]] == ["message"]  # --reasoning-format none: the text whole


def test_a_reasoning_item_in_the_input_is_the_next_assistant_turns_reasoning() -> None:
    from quickdraft.server.responses_api import chat_request

    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"}
    said = {"role": "assistant", "content": "Paris."}
    chat, _ = chat_request({"input": [{"role": "user", "content": "hi"}, thought, said]})
    assert chat["messages"][1:] == [{"role": "assistant", "content": "Paris.", "reasoning_content": "t"}]
    output = {"type": "function_call_output", "call_id": "call_1", "output": "noon"}
    chat, _ = chat_request({"input": [{"role": "user", "content": "hi"}, thought, call, output]})
    assert chat["messages"][1]["reasoning_content"] == "t" and chat["messages"][1]["tool_calls"][0]["id"] == "call_1"
    encrypted = {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "x"}
    chat, _ = chat_request({"input": [{"role": "user", "content": "hi"}, encrypted, said]})
    assert chat["messages"][1:] == [said]  # nothing to read: left out
    with pytest.raises(ApiError, match="reasoning_text"):
        chat_request({"input": [{"type": "reasoning", "content": "t"}]})


def test_a_call_after_the_reasoning_is_a_function_call_item_whole_and_streamed(servers: tuple[Server, Server]) -> None:
    from test_responses_api import raw_events, strictly

    call = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    regex = "\\<think\\>why\\</think\\>" + call.replace("{", "\\{").replace("}", "\\}").replace("<", "\\<")
    tool = {"type": "function", "name": TIME["function"]["name"], "parameters": TIME["function"]["parameters"]}
    tool["strict"] = False  # the regex writes the call: a strict tool (the Responses API's default) would be a 400
    body = {"model": MODEL, "input": "hi", "tools": [tool], "max_output_tokens": 80, "temperature": 0, "regex": regex}
    answer = strictly(httpx.post(f"{servers[0].url}/v1/responses", json=body, timeout=TIMEOUT).json())
    final = strictly(raw_events(servers[0], body)[-1]["response"])
    for output in (answer["output"], final["output"]):
        assert [item["type"] for item in output] == ["reasoning", "function_call"]
        assert output[0]["content"][0]["text"] == "why" and output[0]["status"] == "completed"
        assert output[1]["name"] == "get_time" and json.loads(output[1]["arguments"]) == {}


def test_a_responses_output_with_reasoning_goes_back_as_the_next_turns_input(servers: tuple[Server, Server]) -> None:
    """What an agent sends on its next turn (openai-agents passes a turn's output items back, reasoning included)
    is read as the chat conversation it means."""
    call = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    regex = "\\<think\\>why\\</think\\>" + call.replace("{", "\\{").replace("}", "\\}").replace("<", "\\<")
    tool = {"type": "function", "name": TIME["function"]["name"], "parameters": TIME["function"]["parameters"]}
    tool["strict"] = False  # the regex writes the call: a strict tool (the Responses API's default) would be a 400
    client = servers[0].client()
    first = client.responses.create(model=MODEL, input="hi", tools=[tool], max_output_tokens=80, temperature=0,
                                    extra_body={"regex": regex})  # type: ignore[list-item]  # fmt: skip
    thought, made = first.output
    turn = [{"role": "user", "content": "hi"}, *(item.model_dump(exclude_none=True) for item in first.output),
            {"type": "function_call_output", "call_id": made.call_id, "output": "noon"}]  # fmt: skip
    after = client.responses.create(model=MODEL, input=turn, tools=[tool], max_output_tokens=4, temperature=0)  # type: ignore[arg-type,list-item]
    chat_turn = [{"role": "user", "content": "hi"},
                 {"role": "assistant", "content": "", "reasoning_content": "why", "tool_calls": [
                     {"id": made.call_id, "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": made.call_id, "content": "noon"}]  # fmt: skip
    chat = client.chat.completions.create(model=MODEL, messages=chat_turn, tools=[TIME], max_tokens=4, temperature=0)  # type: ignore[arg-type,list-item]
    assert thought.type == "reasoning" and after.usage.input_tokens == chat.usage.prompt_tokens
    assert after.output_text == (chat.choices[0].message.content or "")


def test_magistrals_special_think_tags_keep_their_text() -> None:
    """[THINK] and [/THINK] are special tokens in Magistral's vocabulary, which an answer's text leaves out: a request
    whose reasoning is split keeps theirs, so an answer opening with [THINK] thinks."""
    from test_tools import CHARS

    template = "{# [THINK] reasons [/THINK] #}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    opening = len(CHARS) + 1  # [THINK]: the first special token after <eos>
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    pipeline = char_pipeline(template, ("[THINK]", "[/THINK]"))
    with serving(pipeline) as split, serving(pipeline, split_reasoning=False) as whole:
        biased = [server.client().chat.completions.create(**ask, logit_bias={str(opening): 100})  # type: ignore[arg-type]
                  for server in (split, whole)]  # fmt: skip
    message = biased[0].choices[0].message
    assert message.reasoning_content == "[THINK][THINK]" and message.content is None  # opened by its first [THINK]
    assert biased[1].choices[0].message.content == "[THINK]" * 3  # not split: the tags stay in the content

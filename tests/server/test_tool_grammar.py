"""The grammars of tool calls (server/tool_grammar.py) beyond a required call's: ``tool_choice`` auto with a strict
function (any text; a call by its schema once the format's opening text is written), and auto beside a
``response_format`` (that content or calls), in every format; and how a request's constraints combine."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import MODEL, serving

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.grammar import GrammarKind, GrammarSpec
from quickdraft.server.errors import ApiError
from quickdraft.server.protocol import _grammar
from quickdraft.server.tool_formats import (
    GRANITE,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_CALL_ID,
    MISTRAL_NAMED,
    OLMO3,
    PHI4_MINI,
    PYTHONIC,
    QWEN_XML,
    ToolFormat,
)
from quickdraft.server.tools import ToolRequest

DRAFTERS_TRIED = ("none", "draft-model", "prompt-lookup", "hybrid")
CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY, "strict": True}}
XML_END = "</parameter>\n</function>\n</tool_call>"
# a call of each format, as its opening text begins it, and the same call with an argument its schema forbids
CALLS: dict[str, tuple[ToolFormat, str]] = {
    "hermes": (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    "xml": (QWEN_XML, f"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n{XML_END}"),
    "named": (MISTRAL_NAMED, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    "call id": (MISTRAL_CALL_ID, '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}'),
    "olmo3": (OLMO3, '<function_calls>get_weather(city="Paris")</function_calls>'),
    "mistral": (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    "llama3": (LLAMA3_JSON, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "granite": (GRANITE, '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
}


def accepts(spec: GrammarSpec, text: str) -> bool:
    import xgrammar

    return bool(xgrammar.testing._is_grammar_accept_string(xgrammar.Grammar.from_ebnf(spec.text), text))


def tools_of(found: ToolFormat, *tools: dict[str, Any], choice: str = "auto", parallel: bool = True) -> ToolRequest:
    names = frozenset(tool["function"]["name"] for tool in tools)
    return ToolRequest(tuple(tools), choice, names, found, parallel)


@pytest.mark.parametrize("case", CALLS)
def test_a_strict_function_is_called_by_its_schema_once_a_call_opens(case: str) -> None:
    found, call = CALLS[case]
    spec = tools_of(found, WEATHER).grammar()
    assert spec is not None and spec.opens_free  # a template's think block may open it
    assert accepts(spec, "It is sunny in Paris.") and accepts(spec, "") and accepts(spec, "<tool")
    assert accepts(spec, call) and accepts(spec, f"Let me look. {call}")
    assert not accepts(spec, call.replace("Paris", "Rome"))  # the schema's enum
    assert not accepts(spec, call.replace("get_weather", "get_wether"))  # an offered function
    loose = {"type": "function", "function": {**WEATHER["function"], "strict": False}}
    assert tools_of(found, loose).grammar() is None  # nothing strict: calls are read, not constrained


@pytest.mark.parametrize("case", ["hermes", "xml", "named"])
def test_tagged_strict_calls_come_one_after_another_unless_parallel_calls_are_off(case: str) -> None:
    found, call = CALLS[case]
    for parallel in (True, False):
        spec = tools_of(found, WEATHER, parallel=parallel).grammar()
        assert spec is not None and accepts(spec, f"{call}\n{call}") == parallel, parallel


def test_calls_that_open_with_no_text_of_their_own_are_not_constrained() -> None:
    """A pythonic list opens with no text of its own, Phi-4-mini's functools with a word prose may hold: constraining
    from it would bind prose that names it ("Use Python's functools module")."""
    assert tools_of(PYTHONIC, WEATHER).grammar() is None and tools_of(PHI4_MINI, WEATHER).grammar() is None


@pytest.mark.parametrize("opened", [False, True], ids=["written", "opened by the template"])
def test_a_reasoning_block_stays_free_text(opened: bool) -> None:
    """A think block may mention a call's opening tag; the calls after it are constrained."""
    spec = tools_of(HERMES, WEATHER).grammar(think=("<think>", "</think>", opened))
    call = CALLS["hermes"][1]
    thought = "I could write <tool_call> here</think>" if opened else "<think>I could write <tool_call> here</think>"
    assert spec is not None and spec.opens_free
    assert accepts(spec, f"{thought}It is sunny.") and accepts(spec, f"{thought}{call}")
    assert not accepts(spec, f"{thought}{call.replace('Paris', 'Rome')}")
    assert accepts(spec, "still thinking")  # an answer may end within its reasoning, or hold none


def test_a_strict_function_whose_schema_a_call_cannot_enforce_is_a_400() -> None:
    unique = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    tool = {"type": "function", "function": {"name": "pick", "parameters": unique, "strict": True}}
    with pytest.raises(ApiError, match=r"uniqueItems\): with a strict function offered every call is constrained"):
        tools_of(HERMES, tool).grammar()


@pytest.mark.parametrize("case", ["hermes", "mistral", "llama3"])
def test_beside_a_response_format_the_answer_is_that_content_or_calls(case: str) -> None:
    found, call = CALLS[case]
    schema = GrammarSpec(GrammarKind.JSON_SCHEMA, '{"type": "object", "properties": {"answer": {"type": "string"}}}')
    loose = {"type": "function", "function": {**WEATHER["function"], "strict": False}}
    spec = tools_of(found, loose).grammar(schema)
    assert spec is not None and not spec.opens_free and accepts(spec, '{"answer": "sunny"}')
    whole_call = call.removeprefix(found.opener) if found.tags is None else call  # as a required call writes it
    assert accepts(spec, whole_call) and not accepts(spec, whole_call.replace("Paris", "Rome"))
    assert accepts(spec, call)  # after the format's opener too: the model's own first token is not masked away
    assert not accepts(spec, "It is sunny.")


def test_a_requests_constraints_combine_as_openai_has_them() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    required = tools_of(HERMES, WEATHER, choice="required")
    call = CALLS["hermes"][1]
    spec = _grammar({"response_format": schema}, required)  # a required answer has no content to shape
    assert spec is not None and accepts(spec, call) and not accepts(spec, "{}")
    for extra, tools in (("regex", required), ("grammar", tools_of(HERMES, WEATHER))):
        with pytest.raises(ApiError, match=f"{extra} constrains the whole answer") as error:
            _grammar({extra: "x"}, tools)
        assert error.value.param == extra
    loose = tools_of(HERMES, {"type": "function", "function": {**WEATHER["function"], "strict": False}})
    assert _grammar({"regex": "x"}, loose) == GrammarSpec(GrammarKind.REGEX, "x")  # auto leaves calls to it
    with pytest.raises(ApiError, match="give one of response_format"):
        _grammar({"response_format": {"type": "json_object"}, "regex": "x"}, None)


def test_strict_tools_and_a_response_format_through_the_server() -> None:
    """The same answer with and without speculation, read as content or calls."""
    from test_tools import char_pipeline

    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "weather?"}], "tools": [WEATHER], "max_tokens": 40,
        "temperature": 0,
    }  # fmt: skip
    with serving(char_pipeline()) as server:
        for extra in ({}, {"response_format": {"type": "json_object"}}):
            answers = []
            for drafter in ("none", "draft-model"):
                response = httpx.post(
                    f"{server.url}/v1/chat/completions", json=body | extra | {"drafter": drafter}, timeout=120
                )
                assert response.status_code == 200, response.text
                answers.append(response.json()["choices"][0]["message"])
            assert answers[0] == answers[1] or _same_calls(answers), answers


def _same_calls(answers: list[dict[str, Any]]) -> bool:
    """The same calls whatever their ids (each answer names its own)."""
    stripped = [[{**call, "id": ""} for call in answer.get("tool_calls") or []] for answer in answers]
    return answers[0]["content"] == answers[1]["content"] and stripped[0] == stripped[1]


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=5)], ids=["greedy", "seeded"]
)
def test_a_lazy_grammar_under_speculation_is_constrained_plain_decoding(sampling: SamplingParams) -> None:
    """A call's opening that the answer writes at once (the trigger is the model's own first character): every
    drafter gives constrained plain decoding's tokens, through free text, the dispatched call and free text again."""
    from test_tools import char_pipeline

    pipeline = char_pipeline()
    prompt = pipeline.encode("user: weather?\nassistant: ")
    first = pipeline.generate(prompt, GenerationConfig(max_new_tokens=1, sampling=sampling), drafter="none").text
    found = ToolFormat("a test's", "-", (first, "</t>"), "", "arguments", listed=False, parallel=True)
    spec = tools_of(found, WEATHER).grammar()
    assert spec is not None
    config = GenerationConfig(max_new_tokens=70, grammar=spec, sampling=sampling, policy="fixed:4")
    answers = {drafter: pipeline.generate(prompt, config, drafter=drafter) for drafter in DRAFTERS_TRIED}
    plain = answers["none"]
    assert all(answer.token_ids == plain.token_ids for answer in answers.values()), answers
    assert plain.text.startswith(f'{first}\n{{"name": "get_weather", "arguments": {{"city": "')  # dispatched
    assert answers["draft-model"].stats.draft_tokens_proposed > 0


CITY_DEFINED = {"type": "object", "$defs": {"city": {"enum": ["Paris", "Oslo"]}},
                "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"]}  # fmt: skip
TREE = {"type": "object", "required": ["v", "child"], "additionalProperties": False,
        "properties": {"v": {"type": "integer"}, "child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}  # fmt: skip


@pytest.mark.parametrize("case", CALLS)
def test_a_function_s_pointers_into_its_own_parameters_hold_in_its_calls(case: str) -> None:
    """``$ref``s start at the parameters' own root, wherever a call's grammar places them (a strict function's, as a
    required one's): into their ``$defs`` in every format, and to the root itself (a recursive schema) where the
    arguments are JSON."""
    found, call = CALLS[case]
    defined = {"type": "function", "function": {"name": "get_weather", "parameters": CITY_DEFINED, "strict": True}}
    spec = tools_of(found, defined).grammar()
    assert spec is not None and accepts(spec, call) and not accepts(spec, call.replace("Paris", "Rome"))
    if '{"city": "Paris"}' not in call:  # XML and pythonic calls: no arguments object
        return
    tree = {"type": "function", "function": {"name": "get_weather", "parameters": TREE, "strict": True}}
    spec = tools_of(found, tree).grammar()
    nested = '{"v": 1, "child": {"v": 2, "child": null}}'
    wrapped = '{"v": 1, "child": {"name": "get_weather", "arguments": {"v": 2, "child": null}}}'  # the call's root
    assert spec is not None and accepts(spec, call.replace('{"city": "Paris"}', nested))
    assert not accepts(spec, call.replace('{"city": "Paris"}', wrapped))

"""What a request's function tools must be, before any is offered to the model: OpenAI's shape (a hosted tool's
type is named: this server runs none), a name OpenAI allows (``NAME_PATTERN``) and once only, parameters that are a
JSON schema, and, for a model whose calls are Python, Python names."""

from __future__ import annotations

import keyword
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from quickdraft.grammar import schema_error
from quickdraft.server.errors import ApiError
from quickdraft.server.fields import check_keys

NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
SHAPE = 'tools must be a list of {"type": "function", "function": {"name", "parameters"}}'
TOOL_KEYS = ("type", "function")
FUNCTION_KEYS = ("name", "description", "parameters", "strict")  # in the order a function is written


def check_shapes(tools: Any) -> None:
    """``tools`` is a list of function tools (``{"type": "function", "function": {...}}``); a hosted tool (web
    search, file search, ...) is refused by its type."""
    if not isinstance(tools, list):
        raise ApiError(400, SHAPE, "tools")
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if isinstance(kind, str) and kind != "function":
            message = f"this server runs function tools only, got {kind!r}"
            raise ApiError(400, message, "tools", code="unsupported_parameter")
        if not is_function(tool):
            raise ApiError(400, SHAPE, "tools")
        check_keys(tool, TOOL_KEYS, f"tools[{index}]")
        check_keys(tool["function"], FUNCTION_KEYS, f"tools[{index}].function")


def check_definitions(tools: list[Any], python_names: bool) -> frozenset[str]:
    """The functions' names, each allowed by OpenAI's rule and given once; their parameters checked (and, with
    ``python_names``, their names and keys as Python names)."""
    names = [tool["function"]["name"] for tool in tools]
    for name in names:
        if not NAME_PATTERN.fullmatch(name):
            message = f"a function's name is 1 to 64 letters, digits, '_' or '-', got {name!r}"
            raise ApiError(400, message, "tools")
    if len(set(names)) < len(names):
        raise ApiError(400, "two tools have the same function name", "tools")
    check_parameters(tools)
    if python_names:
        check_python_names(tools)
    return frozenset(names)


def check_parameters(tools: list[Any]) -> None:
    """Each function's parameters must be a valid JSON schema (checked against the meta-schema its ``$schema`` names,
    2020-12 without one, as OpenAI checks them) of an object, where it names a type, and its description text,
    whatever ``tool_choice`` says: a schema the call grammar cannot follow is refused only where calls are
    constrained (:meth:`ToolRequest.grammar`)."""
    for tool in tools:
        parameters, name = tool["function"].get("parameters") or {}, tool["function"]["name"]
        if (error := schema_error(parameters)) is not None:
            raise ApiError(400, f"a tool's parameters are not a JSON schema ({name!r}): {error}", "tools")
        kind = parameters.get("type", "object") if isinstance(parameters, Mapping) else type(parameters).__name__
        if kind not in ("object", ["object"]):  # a call's arguments are an object: OpenAI's rule too
            message = f"a function's parameters must be a JSON schema of type object, got type {kind!r}"
            raise ApiError(400, f"{message} ({name!r})", "tools")
        description = tool["function"].get("description")
        if description is not None and not isinstance(description, str):
            raise ApiError(400, f"a function's description must be text ({name!r})", "tools")


def check_python_names(tools: list[Any]) -> None:
    """A pythonic call spells its function's name and its arguments' keys as Python names: each must be one (not a
    keyword, and as Python reads it, which folds some characters into others), or its calls could not be read."""
    for tool in tools:
        for name in (tool["function"]["name"], *properties(tool["function"])):
            if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)) or (
                unicodedata.normalize("NFKC", name) != name
            ):
                message = f"{name!r} is not a Python name, as this model's pythonic calls spell names and keys"
                raise ApiError(400, message, "tools")


def properties(function: Mapping[str, Any]) -> Mapping[str, Any]:
    """A function's parameters' properties; none where they are not an object (a constraint of them is a 400)."""
    properties = (function.get("parameters") or {}).get("properties")
    return properties if isinstance(properties, Mapping) else {}


def is_function(tool: Any) -> bool:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        return False
    function = tool.get("function")
    parameters = function.get("parameters") if isinstance(function, Mapping) else None
    return (
        isinstance(function, Mapping)
        and isinstance(function.get("name"), str)
        and bool(function["name"])
        and (parameters is None or isinstance(parameters, Mapping))
    )

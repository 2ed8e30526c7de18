"""Python calls as the pythonic tool-call formats write them (``name(key=value, ...)``): read by Python's parser into
names and literal arguments, never evaluated."""

from __future__ import annotations

import ast
import json
import warnings
from typing import Any

LITERAL_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}  # JSON's too


def python_calls(text: str, lines: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a Python list of them (``lines``: of Python calls, one a statement), each by its plain name with
    keyword arguments whose values are literals (:func:`python_value`), as (name, arguments); none if anything else is
    there."""
    source = text.strip()
    try:
        with warnings.catch_warnings(action="ignore"):  # JSON's "\\/" is an invalid escape to Python, read as JSON's
            tree = ast.parse(source, mode="exec" if lines else "eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # not Python, or nested past the parser's depth
        return []
    if isinstance(tree, ast.Module):
        nodes = [statement.value if isinstance(statement, ast.Expr) else statement for statement in tree.body]
    else:
        nodes = tree.body.elts if isinstance(tree.body, ast.List) else []
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return []
        if any(keyword.arg is None for keyword in node.keywords):  # **spread arguments are not literals
            return []
        try:
            arguments = {str(keyword.arg): python_value(keyword.value, source) for keyword in node.keywords}
        except (ValueError, RecursionError):
            return []
        calls.append((node.func.id, arguments))
    return calls


def python_value(node: ast.expr, source: str) -> Any:
    """A pythonic call's argument in its ``source``: a literal string (read as JSON reads it where it is a JSON string,
    as the constrained calls write it: ``"\\/"`` is ``/``), number, True/False/None (or JSON's true/false/null), or a
    list, tuple or dict of them (a dict's keys strings); anything else, a name or an expression, raises ValueError."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            text = json.loads(ast.get_source_segment(source, node) or "")
        except ValueError:  # a Python string only ('single quotes', "\\x41", "a" "b")
            text = node.value
        text = text if isinstance(text, str) else node.value
        return text.encode("utf-16", "surrogatepass").decode("utf-16")  # "\\ud83d\\ude00" one emoji; a lone one raises
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (int, float))):
        return node.value  # True and False are ints
    if isinstance(node, ast.Name) and node.id in LITERAL_NAMES:
        return LITERAL_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = python_value(node.operand, source)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [python_value(element, source) for element in node.elts]
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        keys = [python_value(key, source) for key in node.keys]  # type: ignore[arg-type]
        if all(isinstance(key, str) for key in keys):
            return dict(zip(keys, (python_value(value, source) for value in node.values), strict=True))
    raise ValueError("not a literal")

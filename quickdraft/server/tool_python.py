"""Python calls as the pythonic tool-call formats write them (``name(key=value, ...)``): read by Python's parser into
names and literal arguments, never evaluated."""

from __future__ import annotations

import ast
import re
from typing import Any

# JSON's escaped slash ("\\/", which the constrained calls may write) outside an escaped backslash: Python keeps its
# backslash, so it is read as JSON reads it, "/", before Python's parser sees it
JSON_SLASH = re.compile(r"(?<!\\)((?:\\\\)*)\\/")
LITERAL_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}  # JSON's too


def python_calls(text: str, lines: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a Python list of them (``lines``: of Python calls, one a statement), each by its plain name with
    keyword arguments whose values are literals (:func:`python_value`), as (name, arguments); none if anything else is
    there."""
    try:
        tree = ast.parse(JSON_SLASH.sub(r"\1/", text.strip()), mode="exec" if lines else "eval")
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
            arguments = {str(keyword.arg): python_value(keyword.value) for keyword in node.keywords}
        except (ValueError, RecursionError):
            return []
        calls.append((node.func.id, arguments))
    return calls


def python_value(node: ast.expr) -> Any:
    """A pythonic call's argument: a literal string, number, True/False/None (or JSON's true/false/null), or a list,
    tuple or dict of them (a dict's keys strings); anything else, a name or an expression, raises ValueError."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "\\ud83d\\ude00" as JSON reads it, one emoji
        return node.value.encode("utf-16", "surrogatepass").decode("utf-16")  # a lone surrogate raises ValueError
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (int, float))):
        return node.value  # True and False are ints
    if isinstance(node, ast.Name) and node.id in LITERAL_NAMES:
        return LITERAL_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = python_value(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [python_value(element) for element in node.elts]
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        keys = [python_value(key) for key in node.keys]  # type: ignore[arg-type]
        if all(isinstance(key, str) for key in keys):
            return dict(zip(keys, (python_value(value) for value in node.values), strict=True))
    raise ValueError("not a literal")

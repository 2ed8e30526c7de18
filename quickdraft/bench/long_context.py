"""Long-context questions (``bench --context-lengths``): standard-library source cut to a length, and a question
about its last function.

The text is this Python's own standard library, so it is there offline and is no benchmark's test set: whole
modules in a fixed order (:data:`MODULES`), cut at a line. For each length, the prompt (the source and the
question, through the chat template) is the longest such cut that leaves room for the answer within the length;
the question asks what the last function of the cut does, so the answer has to read the end of the context.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

from quickdraft.bench.questions import Question
from quickdraft.errors import ConfigError

MODULES = ("typing.py", "argparse.py", "inspect.py", "pathlib.py", "dataclasses.py", "functools.py", "enum.py",
           "tarfile.py", "zipfile.py", "zipfile/__init__.py", "subprocess.py", "ast.py", "configparser.py",
           "textwrap.py", "difflib.py", "statistics.py", "fractions.py", "heapq.py", "bisect.py")  # fmt: skip
MIN_CONTEXT = 64  # tokens: a shorter context is not a long-context question
CountTokens = Callable[[str], int]  # a user message's text -> its tokens as a chat prompt


def source_lines() -> list[str]:
    """The modules of :data:`MODULES` this Python has, each after a header line, as lines with their ends."""
    root = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    for module in (name for name in MODULES if (root / name).is_file()):  # zipfile is a package from 3.12
        lines += [f"# ---- {module} ----\n", *(root / module).read_text(encoding="utf-8").splitlines(keepends=True)]
    return lines


def source_question(lines: Sequence[str]) -> str:
    """The source and a question about the last function defined in it."""
    functions = [line.split("def ", 1)[1].split("(")[0] for line in lines if line.lstrip().startswith("def ")]
    name = functions[-1] if functions else "the last function"
    question = f"Explain step by step what the function `{name}` defined above does, and name one edge case."
    return "".join(lines) + "\n\n" + question


def fitting_question(lines: Sequence[str], count_tokens: CountTokens, budget: int) -> str:
    """:func:`source_question` of the most lines whose prompt has at most ``budget`` tokens."""

    def fits(count: int) -> bool:
        return count_tokens(source_question(lines[:count])) <= budget

    if not fits(1):
        raise ConfigError(f"--context-lengths: {budget} tokens do not hold one line of source and the question")
    if fits(len(lines)):
        raise ConfigError(f"--context-lengths: the standard library's source here fills fewer than {budget} tokens")
    low, high = 1, 2
    while fits(high):  # doubling first: each count costs a tokenization of that much text
        low, high = high, 2 * high
    high = min(high, len(lines)) - 1  # the most lines that may fit
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return source_question(lines[:low])


def check_lengths(lengths: Sequence[int], answer_tokens: int) -> None:
    """Refuse lengths that cannot be asked whatever the model: none, repeated, or too short beside the answer."""
    if not lengths or any(n - answer_tokens < MIN_CONTEXT for n in lengths) or len(set(lengths)) < len(lengths):
        raise ConfigError(
            f"--context-lengths: distinct lengths, each at least {MIN_CONTEXT} tokens beyond --max-new-tokens "
            f"({answer_tokens}), got {list(lengths)}"
        )


def long_context_questions(
    lengths: Sequence[int], answer_tokens: int, count_tokens: CountTokens, max_context: int | None = None
) -> list[Question]:
    """One question per length (category and id ``context-N``), whose prompt leaves ``answer_tokens`` for the
    answer within N tokens. ``max_context``: the model's positions, which no length may pass."""
    check_lengths(lengths, answer_tokens)
    if max_context is not None and max(lengths) > max_context:
        message = f"--context-lengths: {max(lengths)} tokens exceed the {max_context} positions the model holds"
        raise ConfigError(f"{message} (its context, or --max-context)")
    lines = source_lines()
    return [
        Question(f"context-{n}", f"context-{n}", (fitting_question(lines, count_tokens, n - answer_tokens),))
        for n in sorted(lengths)
    ]


def chat_token_counter(tokenizer: object) -> CountTokens:
    """:data:`CountTokens` of a user message through ``tokenizer``'s chat template."""
    from quickdraft.prompts import encode_chat

    return lambda text: len(encode_chat(tokenizer, [{"role": "user", "content": text}]))


def bench_questions(
    target: str, lengths: Sequence[int], answer_tokens: int, cap: int | None = None
) -> tuple[list[Question], str]:
    """The questions of ``bench --context-lengths`` for the target model ``target`` (its tokenizer counts the
    tokens), within its context or the ``cap`` on it (``--max-context``), and what to call them in the results."""
    from quickdraft.models.loading import load_tokenizer, resolve_model

    path = resolve_model(target)
    try:
        max_context = json.loads((path / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        max_context = None  # the model's loading says what is wrong with its files
    max_context = min(n for n in (max_context, cap) if n is not None) if (max_context or cap) else None
    counter = chat_token_counter(load_tokenizer(path))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return long_context_questions(lengths, answer_tokens, counter, max_context), f"python {version} standard library"

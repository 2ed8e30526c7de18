"""Arguments and helpers shared by the commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from quickdraft.drafters import DRAFTERS
from quickdraft.errors import ConfigError, PromptError
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET
from quickdraft.runtime import RUNTIMES


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        metavar="PATH",
        help=f"target model: a packaged name, a transformers directory or a .gguf file (default {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--draft",
        default=None,
        metavar="PATH",
        help=f"draft model for the draft-model drafter, same forms as --target (default {DEFAULT_DRAFT})",
    )
    add_runtime_argument(parser)


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        default="auto",
        help=f"model runtime: {', '.join(RUNTIMES.names())} or auto (default: native for the Llama/Qwen2/Mistral "
        "families, transformers for the rest)",
    )


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is None:
        raise ConfigError("no prompt given: pass the prompt text, or - to read it from standard input")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise PromptError("the prompt is empty: give some text to continue")
    return prompt


def draft_for(args: argparse.Namespace, drafters: Sequence[str]) -> str | None:
    """The draft model to load: the default one if a drafter needs it, else none."""
    if any(DRAFTERS.get(name).needs_draft_model for name in drafters):
        return args.draft or DEFAULT_DRAFT
    if args.draft is not None:
        print(f"quickdraft: note: --draft is not used by the {', '.join(drafters)} drafter", file=sys.stderr)
    return None

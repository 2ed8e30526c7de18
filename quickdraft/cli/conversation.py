"""``generate --interactive``: a conversation on the terminal, each line a user turn answered through the chat
template after the turns before it, streamed as ``generate`` streams one answer.

Rules:
- The conversation opens with ``--system``'s message, where given, after every ``/reset`` too.
- The prompt argument, where given, is the first turn; then every line of standard input is one, or every block of
  lines from one opening with three double quotes (:data:`BLOCK`) to one closing with them. Where the input is a
  terminal they are read after ``>>>`` (``...`` within a block), with line editing and a history where the output is
  one too. ``/reset`` starts a new conversation, ``/exit`` or ``/bye`` (or the end of the input) ends it, ``/help``
  lists these, and a blank line asks nothing; any other line of one word like them (:data:`COMMAND`) is an unknown
  command, said so and never sent.
- A turn that is not text, or that the context cannot hold with ``--max-new-tokens``, is refused with the error and
  left out of the conversation, which goes on.
- Where the runtime's cached prefixes are exact (the native runtime), a turn reads its earlier turns from a prefix cache
  of :data:`PREFIX_CACHE_MB`: it costs its new tokens, not the whole conversation's.
- Each answer's statistics follow it on stderr, as ``generate``'s do.
- Ctrl-C while an answer streams stops that answer at its next piece of text (its request cancelled, its caches
  freed); what was shown of it stays in the conversation as the assistant's turn. A second Ctrl-C in the same answer,
  or one at the prompt, ends the program.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from quickdraft.cli.generate_options import opening

EXIT_WORDS = frozenset({"/exit", "/bye"})
RESET_WORD = "/reset"
HELP_WORDS = frozenset({"/help", "/?"})
COMMAND = re.compile(r"/[A-Za-z?]+")  # a line of one such word is a command, never a turn
HELP = (
    "/reset starts a new conversation, /exit or /bye (or Ctrl-D) ends it, /help shows this; a line opening with "
    '""" starts a turn of several lines, one ending with """ ends it; Ctrl-C stops an answer'
)
BLOCK = '"""'  # opens and closes a turn of several lines, as in ollama
PREFIX_CACHE_MB = 512  # the conversation's keys and values, kept between its turns


def turns(first: str | None) -> Iterator[str]:
    """The user's turns: ``first`` where given, then standard input's lines, until it ends; a line opening with
    :data:`BLOCK` starts a turn of several lines, which ends on the line that closes with it (or with the input)."""
    if first is not None:
        yield first
    if isinstance(sys.stdin, io.TextIOWrapper):  # read as UTF-8: other bytes reach the turn, refused there alone
        sys.stdin.reconfigure(encoding="utf-8", errors="surrogateescape")
    asking = sys.stdin.isatty()
    editing = asking and sys.stdout.isatty() and line_editing()

    def read(prompt: str) -> str | None:
        """A line without its newline, None at the input's end; on a terminal, what follows Ctrl-D or Ctrl-C starts
        a line of its own."""
        try:
            if editing:  # the prompt goes where the answers go: the terminal
                return input(prompt)
            if asking:
                sys.stderr.write(prompt)
                sys.stderr.flush()
            if line := sys.stdin.readline():
                return line.removesuffix("\n")
            raise EOFError
        except (EOFError, KeyboardInterrupt) as ending:
            if asking:
                (sys.stdout if editing else sys.stderr).write("\n")
            if isinstance(ending, KeyboardInterrupt):
                raise
            return None

    while (line := read(">>> ")) is not None:
        if not line.lstrip().startswith(BLOCK):
            yield line
            continue
        text: str | None = line.lstrip().removeprefix(BLOCK)
        lines = []
        while text is not None and not text.rstrip().endswith(BLOCK):
            lines.append(text)
            text = read("... ")
        if text is not None:
            lines.append(text.rstrip().removesuffix(BLOCK))
        yield "\n".join(lines).strip("\n")
        if text is None:
            return


def line_editing() -> bool:
    """Whether ``input`` edits lines and keeps a history (Python's readline module, where the platform has it)."""
    try:
        import readline  # noqa: F401  (importing it is what turns editing on for input())
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def interruptible() -> Iterator[threading.Event]:
    """Within it, a first Ctrl-C (SIGINT) sets the event the caller polls instead of raising; a second raises
    KeyboardInterrupt as usual. Off the main thread, where no handler can be set, or where SIGINT is not Python's
    default (ignored, as in a background job), it is left as it is."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # ignored (a background job), or the caller's
    ):
        yield stop
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def converse(pipeline: Any, args: argparse.Namespace, config: Any, options: Any) -> None:
    """Answer every turn of :func:`turns` (the rules above) with ``config`` and ``args.drafter``."""
    from quickdraft.engine import Engine
    from quickdraft.engine.prefix_cache import PrefixCache
    from quickdraft.errors import PromptError

    target = pipeline.target
    if target.reusable_prefixes:  # later turns start with the earlier ones: read once, not at every turn
        cache = PrefixCache(PREFIX_CACHE_MB * 2**20, target.cache_bytes, target.copy_prefix)
        pipeline.engine = Engine(target, pipeline.tokenizer, pipeline.eos_token_ids, prefix_cache=cache)
    messages = opening(args)
    # a template that cannot render the conversation's first turn at all (none, or no system turn) ends it here
    pipeline.encode_chat([*messages, {"role": "user", "content": "Hello"}], None, args.chat_template_kwargs)
    for text in turns(args.prompt):
        word = text.strip()
        if word in EXIT_WORDS:
            return
        if word == RESET_WORD:
            messages = opening(args)
            print("quickdraft: a new conversation", file=sys.stderr)
            continue
        if word in HELP_WORDS or COMMAND.fullmatch(word):
            said = HELP if word in HELP_WORDS else f"unknown command {word}, not sent (/help lists them)"
            print(f"quickdraft: {said}", file=sys.stderr)
            continue
        if not word:
            continue
        messages.append({"role": "user", "content": text})
        try:
            prompt_ids = pipeline.encode_chat(messages, None, args.chat_template_kwargs)
            stream = pipeline.stream(prompt_ids, config, args.drafter, options=options)
        except PromptError as error:  # not text, or the conversation outgrew the context: this turn is left out
            messages.pop()
            hint = f"; {RESET_WORD} starts a new conversation" if error.setting == "max_new_tokens" else ""
            print(f"quickdraft: error: {error} (this turn is left out{hint})", file=sys.stderr)
            continue
        shown: list[str] = []
        deltas = iter(stream)
        with interruptible() as stop:
            for delta in deltas:
                sys.stdout.write(delta)
                sys.stdout.flush()
                shown.append(delta)
                if stop.is_set():
                    break
            else:
                stop.clear()  # the answer ended on its own: nothing left to stop
        sys.stdout.write("\n")
        if stop.is_set():  # Ctrl-C: the request is cancelled, what was shown of the answer is kept
            deltas.close()
            messages.append({"role": "assistant", "content": "".join(shown)})
            print(f"[{args.drafter}, interrupted: the text shown stays in the conversation]", file=sys.stderr)
            continue
        result = stream.finish()
        messages.append({"role": "assistant", "content": result.text})
        print(f"[{args.drafter}, finish: {result.finish_reason}] {result.stats.summary()}", file=sys.stderr)

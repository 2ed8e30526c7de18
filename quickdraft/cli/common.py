"""Arguments and helpers shared by the commands."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quickdraft.drafters import DRAFTERS
from quickdraft.errors import ConfigError, PromptError
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET
from quickdraft.runtime import RUNTIMES
from quickdraft.runtime.names import (
    AUTO_DEVICE,
    DEVICE_FORMS,
    DRAFT_VOCABULARY,
    DRAFT_WEIGHTS,
    EXACT_TYPES,
    KV_CACHE_DEFAULT,
    KV_CACHE_DTYPES,
    WEIGHT_FORMATS,
)
from quickdraft.runtime.native.architecture import ARCHITECTURES


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        metavar="PATH",
        help=f"target model: a packaged name, a transformers directory, a .gguf file or hf:OWNER/REPO/FILE.gguf "
        f"(downloaded once from the Hugging Face Hub or $HF_ENDPOINT, resumed if interrupted; "
        f"default {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--draft",
        default=None,
        metavar="PATH",
        help=f"draft model of the drafters that run one (hybrid-suffix, hybrid, draft-model), same forms as "
        f"--target, or auto: the largest model at hand (packaged or a GGUF file used before) that shares the "
        f"target's vocabulary and is at most half its size (default {DEFAULT_DRAFT})",
    )
    parser.add_argument(
        "--draft-head",
        default=None,
        metavar="FILE",
        help="trained draft head for the eagle drafters (default: the one `quickdraft train-draft` wrote for "
        "the target, $QUICKDRAFT_CACHE/draft-heads/<target>.safetensors)",
    )
    add_runtime_argument(parser)
    add_cache_arguments(parser)
    add_draft_load_arguments(parser)


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """What the models keep for a request's positions: how keys and values are held, and how many positions."""
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=None,
        help=f"what the native runtime's KV caches hold keys and values as (default {KV_CACHE_DEFAULT}: half the "
        "memory and reading of float32; the transformers runtime keeps its model's dtype)",
    )
    parser.add_argument(
        "--max-context",
        type=positions,
        default=None,
        metavar="N",
        help="the most positions a request holds, prompt and answer together (llama.cpp's --ctx-size, vLLM's "
        "--max-model-len): a cap on the target's declared context, which also bounds the memory the models keep "
        "for positions, such as their RoPE tables (default: the whole declared context)",
    )


def positions(text: str) -> int:
    """A number of positions, >= 1 (argparse's type: a bad one is a usage error naming the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of positions, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a number of positions >= 1, got {value}")
    return value


def add_draft_load_arguments(parser: argparse.ArgumentParser, prefix: str = "--draft-") -> None:
    """How the draft model is stored (native runtime): it changes how often drafts are accepted, never the output.
    ``prefix`` "--" gives the same options for the one model a command loads (``profile``)."""
    which = "draft model" if prefix == "--draft-" else "model"
    parser.add_argument(
        f"{prefix}weights",
        choices=WEIGHT_FORMATS,
        default=None,
        help=f"{which} weight format on the native runtime: auto keeps a GGUF file's "
        f"{', '.join(EXACT_TYPES['auto'])} tensors as stored and the rest in 7-bit int8, q4 keeps its Q4_K tensors "
        f"and stores the rest in 4 bits, int8 stores everything in 7 bits (draft model default "
        f"{DRAFT_WEIGHTS}, other models auto)",
    )
    parser.add_argument(
        f"{prefix}vocabulary",
        type=int,
        default=None,
        metavar="N",
        help=f"compute the {which}'s logits for its N most frequent tokens and each request's prompt tokens only "
        f"(FR-Spec: the rest are never drafted); 0 = all (draft model default {DRAFT_VOCABULARY}, other models 0)",
    )


def add_sampling_arguments(parser: argparse.ArgumentParser, sampled: str, temperature: str, seed: str) -> None:
    """The benchmarks' --question-seed (of what is ``sampled``), --temperature and --seed, with their help texts."""
    parser.add_argument("--question-seed", type=int, default=0, metavar="N", help=f"seed of {sampled} (default 0)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help=temperature)
    parser.add_argument("--seed", type=int, default=None, metavar="S", help=seed)


def add_chat_template_argument(parser: argparse.ArgumentParser, variables: bool = True) -> None:
    """``--chat-template FILE`` and, with ``variables``, ``--chat-template-kwargs JSON``."""
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template (as transformers' apply_chat_template reads it) to use in place of the model's: "
        "for a model without one, or to change its turns and system prompt",
    )
    if not variables:
        return
    parser.add_argument(
        "--chat-template-kwargs",
        metavar="JSON",
        type=template_variables,
        help="more variables for the chat template, a JSON object (vLLM's chat_template_kwargs): "
        "'{\"enable_thinking\": false}' turns Qwen3's thinking off (serve: for every conversation, a request's own "
        "chat_template_kwargs taking precedence name by name)",
    )


def template_variables(text: str) -> dict[str, Any]:
    """``--chat-template-kwargs JSON``: a JSON object (argparse reports the error before any model loads)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'a JSON object of template variables, such as {{"enable_thinking": false}}, not {text!r}'
        )
    return value


def chat_template_of(args: argparse.Namespace) -> str | None:
    """The text of ``--chat-template FILE`` where the command has the option, it was given and is used: a command
    with ``--chat`` uses it only with ``--chat`` (and notes it unused without)."""
    path = getattr(args, "chat_template", None)
    return None if path is None or not getattr(args, "chat", True) else read_text("--chat-template", path)


def read_text(flag: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{flag} {path}: cannot read it as text ({error})") from None


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        default="auto",
        help=f"model runtime: {', '.join(RUNTIMES.names())} or auto (default: native for the families it runs, by "
        f"config.json's model_type: {', '.join(ARCHITECTURES)}; transformers for the rest)",
    )
    parser.add_argument(
        "--device",
        default=AUTO_DEVICE,
        metavar="DEVICE",
        help=f"where the models run: {DEVICE_FORMS} (default auto: the first CUDA GPU torch sees, on the "
        "transformers runtime in bf16, else the CPU on the runtime --runtime picks)",
    )


def gpu_note(device: object) -> str:
    """What a user running on a GPU should know (docs/gpu.md)."""
    return (
        f"on {device} the models run eagerly on transformers (a batch's requests one after another); "
        "to serve on a GPU, vLLM and SGLang are much faster (docs/gpu.md)"
    )


def load_models(args: argparse.Namespace, draft: str | None) -> Any:
    """The pipeline of :func:`add_model_arguments`' arguments with ``draft`` as the draft model (None: none)."""
    from quickdraft.api import Pipeline

    pipeline = Pipeline.load(
        args.target,
        draft,
        args.runtime,
        draft_weights=args.draft_weights if draft else None,  # without a draft, draft_for noted them unused
        draft_vocabulary=args.draft_vocabulary if draft else None,
        device=args.device,
        chat_template=chat_template_of(args),
        kv_cache_dtype=args.kv_cache_dtype,
        max_context=args.max_context,
    )
    if pipeline.bridge is not None:  # the user asked for this draft: say how it drafts
        print(f"quickdraft: note: {pipeline.pairing()}", file=sys.stderr)
    return pipeline


def read_prompt(args: argparse.Namespace, empty_ok: bool = False) -> str:
    """The prompt argument's text (standard input's for -); empty only where ``empty_ok`` (an infill's prefix)."""
    if args.prompt is None:
        raise ConfigError("no prompt given: pass the prompt text, or - to read it from standard input")
    prompt = read_stdin() if args.prompt == "-" else args.prompt
    if not prompt.strip() and not empty_ok:
        raise PromptError("the prompt is empty: give some text to continue")
    return prompt


def draft_for(args: argparse.Namespace, drafters: Sequence[str]) -> str | None:
    """The draft model to load: the default one if a drafter needs it, else none."""
    if any(DRAFTERS.get(name).needs_draft_model for name in drafters):
        return args.draft or DEFAULT_DRAFT
    draft_options = {
        "--draft": args.draft,
        "--draft-weights": args.draft_weights,
        "--draft-vocabulary": args.draft_vocabulary,
    }
    for option in (option for option, value in draft_options.items() if value is not None):
        print(f"quickdraft: note: {option} is not used by the {', '.join(drafters)} drafter", file=sys.stderr)
    return None


def read_stdin() -> str:
    """Standard input as UTF-8 text; bytes that are not UTF-8 raise ``PromptError`` (never a guess)."""
    if sys.stdin is None:  # started with standard input closed (`<&-`)
        raise PromptError("standard input is closed: give the prompt as an argument or pipe it in")
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream (tests, embedding): already decoded
        return sys.stdin.read()
    data = stream.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptError(
            f"standard input is not UTF-8 text: byte 0x{data[error.start]:02x} at offset {error.start} "
            "cannot be decoded; convert it first (e.g. iconv -t UTF-8)"
        ) from None


def check_output_file(path: Path, option: str = "--out") -> None:
    """Fail before any work if ``path`` cannot be written as a file (the work's result would be lost)."""
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{option} {path} cannot be written (permission denied)")
    _check_can_create_in(path.parent, f"{option} {path}")


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Fail before any work if ``path`` is not a directory that can be created and written. The directories this
    makes are removed at exit if they are still empty: a command that fails before it writes leaves nothing."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file; give a directory")
    made = [parent for parent in (path, *path.parents) if not parent.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{option} {path} cannot be created: {error.strerror}") from None
    atexit.register(_remove_if_empty, made)
    _check_can_create_in(path, f"{option} {path}")


def _remove_if_empty(directories: list[Path]) -> None:
    for directory in directories:  # deepest first: a parent is empty only once its child is gone
        with contextlib.suppress(OSError):
            directory.rmdir()  # fails on a directory that holds anything


def _check_can_create_in(directory: Path, what: str) -> None:
    if not directory.is_dir():
        state = "is a file, not a directory" if directory.exists() else "does not exist"
        raise ConfigError(f"{what}: {directory} {state}")
    try:
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as error:
        raise ConfigError(f"{what} cannot be written: {error.strerror or error}") from None

"""llama.cpp's ``llama-server`` as a ``bench-serve`` peer: started by the bench on the same GGUF files.

Each ``NAME=llama-server[:draft][:cache]`` configuration gets its own server on a free loopback port, built
from the same vendored llama.cpp as ``llama-cpp-draft`` (``llama_tools.py``), with:

- as many slots as the run can have requests in flight (``--parallel``), in one KV pool sized for every slot's
  longest prompt plus its new tokens (``--kv-unified``);
- the bench's thread count for the target and the draft;
- ``:draft``: its draft-model speculation on the draft's GGUF file (``--spec-type draft-simple``, its default
  3 drafts);
- the prompt cache off (``--cache-ram 0`` and ``cache_prompt: false`` per request, so no run reuses an earlier
  run's prompts), or ``:cache``: on, with llama.cpp's defaults.

Its greedy tokens come from llama.cpp's kernels, so they are not compared with quickdraft's reference.
"""

from __future__ import annotations

import socket
from pathlib import Path

from quickdraft.bench.llama_cpp import verified_gguf
from quickdraft.bench.llama_tools import SERVER_TOOL, llama_tool
from quickdraft.bench.serve_load import ServedConfig
from quickdraft.errors import ConfigError
from quickdraft.models import find_draft, load_tokenizer, resolve_model
from quickdraft.models.pairing import AUTO as AUTO_DRAFT

CONTEXT_PER_SLOT = 4096  # Spec-Bench's longest first turn in the chat template and 96 new tokens fit


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gguf_files(target: str, draft: str | None) -> tuple[Path, Path | None]:
    """The target's (and the draft's: ``auto`` as ``--draft auto`` picks it) GGUF files, checked against the
    digests their conversion recorded."""
    target_path = resolve_model(target, True)
    target_gguf = verified_gguf(target_path)
    if draft == AUTO_DRAFT:
        draft = find_draft(target_path, load_tokenizer(target_path))
    return target_gguf, (verified_gguf(resolve_model(draft, True), "draft") if draft is not None else None)


def server_command(
    config: ServedConfig, target: Path, draft: Path | None, slots: int, threads: int, port: int,
    chat_template: Path | None = None,
) -> list[str]:  # fmt: skip
    """The command line of ``config``'s llama-server (the binary is built on first use); ``chat_template``: a Jinja
    file in place of the GGUF's template (read with llama.cpp's Jinja engine, as transformers reads it)."""
    if not config.is_peer:
        raise ValueError(f"{config.name} is not a llama-server configuration")
    if config.drafter != "none" and draft is None:
        raise ConfigError(f"configuration {config.name!r} speculates with a draft model, but none was given")
    command = [
        str(llama_tool(SERVER_TOOL)), "-m", str(target), "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(slots), "--kv-unified", "-c", str(slots * CONTEXT_PER_SLOT),
        "-t", str(threads), "-tb", str(threads), "-ngl", "0", "--no-webui",
    ]  # fmt: skip
    if config.drafter != "none":
        command += ["-md", str(draft), "--spec-type", "draft-simple", "-ngld", "0"]
        command += ["-td", str(threads), "-tbd", str(threads)]
    if not config.prompt_cache:
        command += ["--cache-ram", "0"]
    if chat_template is not None:
        command += ["--jinja", "--chat-template-file", str(chat_template)]
    return command

"""Peers measured in the same process: what every peer shares (a clear error when its package is missing,
step times from a streamer, quiet subprocesses), and transformers' own generation on the same model objects."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import subprocess
import time
from typing import Any

import torch

from quickdraft.bench.base import TurnResult
from quickdraft.errors import ConfigError

# transformers' generate() arguments of each peer; the assistant (draft) model is added where named.
PEER_SETTINGS: dict[str, dict[str, Any]] = {
    "hf-generate": {},
    # transformers' defaults for assisted generation: 20 drafts, constant schedule, confidence cut-off 0.4
    "hf-assisted": {
        "assistant": True,
        "num_assistant_tokens": 20,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.4,
    },
    "hf-assisted-tuned": {
        "assistant": True,
        "num_assistant_tokens": 2,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    },
    "hf-prompt-lookup": {"prompt_lookup_num_tokens": 10},
}
ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def settings_key(*parts: str) -> str:
    """A short digest naming a cached build or export by what went into it (versions, options)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def require_module(method: str, module: str, package: str, install: str) -> None:
    """A clear error, before anything is loaded or timed, when a peer's package is not installed (or its
    compiled library does not load)."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"method {method!r} needs {package}, which is not installed: {install}") from None
    except (OSError, RuntimeError) as error:  # bindings raise these when their shared library fails to load
        raise ConfigError(f"method {method!r}: {package} does not load ({error}); {install}") from None


def package_version(distribution: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_quietly(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run a build or export step; on failure, one error naming ``what`` failed with the end of its output."""
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise ConfigError(f"{what} failed at `{' '.join(command[:4])} ...`:\n{tail}")


class StepClock:
    """A streamer that notes when each step's tokens come out: [(seconds, count)] from its creation.
    transformers calls ``put`` (the prompt first) and ``end``; other peers' streamers call ``tick``."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.events: list[tuple[float, int]] = []
        self.wall_time_s: float | None = None
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:  # generate() first sends the prompt
            self._seen_prompt = True
            return
        self.tick(int(value.numel()))

    def tick(self, count: int) -> None:
        """``count`` tokens of one step came out now."""
        self.events.append((time.perf_counter() - self.started, count))

    def end(self) -> None:
        pass

    def stop(self) -> None:
        """The generate call returned now."""
        self.wall_time_s = time.perf_counter() - self.started

    def turn_result(self, token_ids: list[int], **draft_counts: int) -> TurnResult:
        """The turn, timed from this clock's start to :meth:`stop`."""
        if self.wall_time_s is None:
            raise RuntimeError("StepClock.turn_result() before stop()")
        return TurnResult(
            token_ids=token_ids,
            wall_time_s=self.wall_time_s,
            step_sizes=[count for _, count in self.events],
            step_times_s=[seconds for seconds, _ in self.events],
            **draft_counts,
        )


def hf_generate(
    model: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_token_ids: frozenset[int],
    pad_token_id: int | None,
    assistant_model: Any = None,
    streamer: StepClock | None = None,
    **settings: Any,
) -> list[int]:
    """New token ids of transformers greedy ``generate``, plain, assisted or with prompt lookup."""
    input_ids = torch.tensor([prompt_ids], device=model.device)
    if assistant_model is not None:
        # transformers reads these from the assistant's own generation config (and may write back into it)
        for key in ASSISTANT_KEYS:
            setattr(assistant_model.generation_config, key, settings.pop(key))
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos_token_ids),
        pad_token_id=pad_token_id,
        temperature=None,
        top_p=None,
        top_k=None,
        assistant_model=assistant_model,
        streamer=streamer,
        **settings,
    )
    return output[0, len(prompt_ids) :].tolist()


def hf_greedy_generate(
    model: Any, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: frozenset[int], pad_token_id: int | None
) -> list[int]:
    """New token ids of transformers ``generate(do_sample=False)``: the reference for greedy equality."""
    return hf_generate(model, prompt_ids, max_new_tokens, eos_token_ids, pad_token_id)

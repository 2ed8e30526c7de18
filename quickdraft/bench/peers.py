"""Peers measured in the same process: transformers' own generation on the same model objects."""

from __future__ import annotations

import time
from typing import Any

import torch

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


class StepClock:
    """A transformers streamer that notes when each step's tokens come out: [(seconds, count)]."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.events: list[tuple[float, int]] = []
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:  # generate() first sends the prompt
            self._seen_prompt = True
            return
        self.events.append((time.perf_counter() - self.started, int(value.numel())))

    def end(self) -> None:
        pass


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

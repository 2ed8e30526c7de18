"""Peers measured in the same process: transformers' own generation on the same model object."""

from __future__ import annotations

from typing import Any

import torch


def hf_greedy_generate(
    model: Any, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: frozenset[int], pad_token_id: int | None
) -> list[int]:
    """New token ids of transformers ``generate(do_sample=False)``: the reference for greedy equality."""
    input_ids = torch.tensor([prompt_ids])
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
    )
    return output[0, len(prompt_ids) :].tolist()

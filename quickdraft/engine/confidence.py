"""Which requests' policies hear the target's confidence after a token chosen without drafts, a few a step."""

from __future__ import annotations

import torch

from quickdraft.engine.request import RunningRequest
from quickdraft.lossless.sampling import top_probability

CONFIDENCE_ROWS_PER_STEP = 4  # requests whose policy hears the target's confidence in a step


def hear_confidence(rows: list[tuple[RunningRequest, torch.Tensor]], step: int) -> None:
    """The policies of these requests, whose tokens were chosen without drafts, hear the target's top probability
    at their ``[1, V]`` logits if they want it: at most :data:`CONFIDENCE_ROWS_PER_STEP` a step, those that
    heard it longest ago first. Each is a pass of exp over the vocabulary, about 0.14 ms: for every request of
    a busy batch that was as much as goodput's bids and batch plan together, for an estimate that only steadies
    over many steps anyway."""
    rows = [(state, logits) for state, logits in rows if state.policy.wants_confidence()]
    rows = sorted(rows, key=lambda row: row[0].confidence_step)[:CONFIDENCE_ROWS_PER_STEP]
    for state, logits in rows:
        state.confidence_step = step
        state.policy.observe_confidence(float(top_probability(logits)))

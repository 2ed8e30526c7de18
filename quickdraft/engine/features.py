"""The step's target forward: logits for every row, and the target's features for drafters that read them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.drafters import Drafter
from quickdraft.runtime.base import BatchRow, Runtime


def target_forward(
    target: Runtime, rows: Sequence[BatchRow], drafters: Sequence[Drafter]
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """One forward over ``rows`` (row i belongs to a request drafting with ``drafters[i]``): per row its logits,
    and its features ``[K, C·H]`` over its drafter's :attr:`~Drafter.feature_layers` (None for a drafter that
    reads none). The forward captures the union of the layers asked for, once."""
    if not rows:
        return [], []
    wanted = {drafter.feature_layers for drafter in drafters} - {()}
    if not wanted:
        return target.forward_batch(rows), [None] * len(rows)
    layers = sorted({layer for drafter_layers in wanted for layer in drafter_layers})
    logits, features = target.forward_batch_with_features(rows, layers)
    width = target.hidden_size
    picked: list[torch.Tensor | None] = []
    for drafter, row_features in zip(drafters, features, strict=True):
        if not drafter.feature_layers:
            picked.append(None)
        elif list(drafter.feature_layers) == layers:
            picked.append(row_features)
        else:
            columns = [layers.index(layer) for layer in drafter.feature_layers]
            picked.append(torch.cat([row_features[:, c * width : (c + 1) * width] for c in columns], dim=-1))
    return logits, picked

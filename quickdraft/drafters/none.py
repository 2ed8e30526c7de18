"""``none``: propose nothing, so every step is one plain target step (the baseline)."""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, KeepDrafting
from quickdraft.runtime.base import Runtime
from quickdraft.sampling import SamplingParams


class NoDrafter(Drafter):
    proposes_drafts = False

    @classmethod
    def create(cls, target: Runtime, draft: Runtime | None, options: DrafterOptions) -> NoDrafter:
        return cls()

    def propose(
        self,
        context_ids: list[list[int]],
        num_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
        copies: bool = True,
    ) -> DraftProposal:
        return DraftProposal.empty(len(context_ids))

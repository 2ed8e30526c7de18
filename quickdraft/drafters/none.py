"""``none``: propose nothing, so every step is one plain target step (the baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftTask
from quickdraft.drafters.records import DrafterRecords
from quickdraft.runtime.base import Runtime


class NoDrafter(Drafter):
    proposes_drafts = False

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> NoDrafter:
        return cls(records)

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        return [DraftProposal.empty() for _ in tasks]

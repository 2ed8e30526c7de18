"""Drafters by name: ``DRAFTERS.get(name).create(target, draft, options)``.

The registry names each drafter by the module defining it, and the classes below are imported on first use, so a
command's parser lists the drafters without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quickdraft.lazy import lazy_exports
from quickdraft.registry import Registry

if TYPE_CHECKING:
    from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
    from quickdraft.drafters.hybrid import HybridDrafter
    from quickdraft.drafters.records import DrafterRecords

DRAFTERS: Registry[type[Drafter]] = Registry(
    "drafter",
    setting="drafter",
    lazy={
        "draft-model": "quickdraft.drafters.draft_model:DraftModelDrafter",
        "prompt-lookup": "quickdraft.drafters.prompt_lookup:PromptLookupDrafter",
        "suffix": "quickdraft.drafters.suffix:SuffixDrafter",
        "early-exit": "quickdraft.drafters.early_exit:EarlyExitDrafter",
        "eagle": "quickdraft.drafters.eagle:EagleDrafter",
        "hybrid": "quickdraft.drafters.hybrid:HybridDrafter",
        "hybrid-eagle": "quickdraft.drafters.hybrid:HybridEagleDrafter",
        "hybrid-suffix": "quickdraft.drafters.hybrid:HybridSuffixDrafter",
        "none": "quickdraft.drafters.none:NoDrafter",
    },
)

# what `generate`, the library and the server draft with unless told otherwise (docs/benchmarks.md has the runs)
DEFAULT_DRAFTER = "hybrid-suffix"

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DraftProposal": "quickdraft.drafters.base",
        "DraftState": "quickdraft.drafters.base",
        "DraftTask": "quickdraft.drafters.base",
        "Drafter": "quickdraft.drafters.base",
        "DrafterOptions": "quickdraft.drafters.base",
        "DrafterRecords": "quickdraft.drafters.records",
        "HybridDrafter": "quickdraft.drafters.hybrid",
    },
)

__all__ = [
    "DEFAULT_DRAFTER",
    "DRAFTERS",
    "DraftProposal",
    "DraftState",
    "DraftTask",
    "Drafter",
    "DrafterOptions",
    "DrafterRecords",
    "HybridDrafter",
]

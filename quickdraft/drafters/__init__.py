"""Drafters by name: ``DRAFTERS.get(name).create(target, draft, options)``."""

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.drafters.early_exit import EarlyExitDrafter
from quickdraft.drafters.hybrid import HybridDrafter, HybridEagleDrafter, HybridSuffixDrafter
from quickdraft.drafters.none import NoDrafter
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.records import DrafterRecords
from quickdraft.drafters.suffix import SuffixDrafter
from quickdraft.registry import Registry

DRAFTERS: Registry[type[Drafter]] = Registry("drafter")
DRAFTERS.register("draft-model")(DraftModelDrafter)
DRAFTERS.register("prompt-lookup")(PromptLookupDrafter)
DRAFTERS.register("suffix")(SuffixDrafter)
DRAFTERS.register("early-exit")(EarlyExitDrafter)
DRAFTERS.register("eagle")(EagleDrafter)
DRAFTERS.register("hybrid")(HybridDrafter)
DRAFTERS.register("hybrid-eagle")(HybridEagleDrafter)
DRAFTERS.register("hybrid-suffix")(HybridSuffixDrafter)
DRAFTERS.register("none")(NoDrafter)

# what `generate`, the library and the server draft with unless told otherwise (docs/benchmarks.md has the runs)
DEFAULT_DRAFTER = "hybrid-suffix"

__all__ = [
    "DEFAULT_DRAFTER",
    "DRAFTERS",
    "DraftProposal",
    "DraftState",
    "DraftTask",
    "Drafter",
    "DrafterOptions",
    "DrafterRecords",
]

"""How many tokens to draft before each step: policies by name (``make_policy("goodput", context)``).

``base`` holds the interface and the registry; ``simple`` the policies that need no measurements;
``goodput`` the cost-aware one; ``specdec`` the one with a trained acceptance head. Importing this
package registers them all.
"""

from quickdraft.policies import goodput, simple, specdec  # noqa: F401 - each registers its policies
from quickdraft.policies.base import (
    MAX_DRAFT_TOKENS,
    MODEL_DRAFTS,
    POLICIES,
    UNKNOWN_STATE,
    DraftBid,
    DraftStep,
    KeepDrafting,
    Offer,
    Policy,
    PolicyContext,
    PolicyKind,
    PolicySpec,
    StepOutcome,
    StepState,
    make_policy,
    parse_policy,
)
from quickdraft.policies.goodput import GoodputPolicy
from quickdraft.policies.planner import StepCosts, alone_in_step, best_gamma, plan_step, step_reach
from quickdraft.policies.records import (
    AcceptanceRecord,
    AnswerLength,
    AnswerLengthRecord,
    BetaCounts,
    StepTimeRecord,
    draft_outcomes,
)
from quickdraft.policies.simple import ConfidencePolicy, FixedPolicy, HeuristicPolicy
from quickdraft.policies.specdec import SpecDecPolicy

__all__ = [
    "MAX_DRAFT_TOKENS",
    "MODEL_DRAFTS",
    "POLICIES",
    "UNKNOWN_STATE",
    "AcceptanceRecord",
    "AnswerLength",
    "AnswerLengthRecord",
    "BetaCounts",
    "ConfidencePolicy",
    "DraftBid",
    "DraftStep",
    "FixedPolicy",
    "GoodputPolicy",
    "HeuristicPolicy",
    "KeepDrafting",
    "Offer",
    "Policy",
    "PolicyContext",
    "PolicyKind",
    "PolicySpec",
    "SpecDecPolicy",
    "StepCosts",
    "StepOutcome",
    "StepState",
    "StepTimeRecord",
    "alone_in_step",
    "best_gamma",
    "draft_outcomes",
    "make_policy",
    "parse_policy",
    "plan_step",
    "step_reach",
]

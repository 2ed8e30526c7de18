"""``early-exit``: self-speculation with the target's own first layers (DEL-style dynamic exit layer).

A draft token is the target's first L layers, then its final norm and LM head: no second model,
and the keys and values those layers write go straight into the target's own cache (the
verify forward over the same positions overwrites them with identical values for those layers
and fills in the rest). The exit layer is chosen before each step among a few candidates from
each one's acceptance, tracked online (a Beta posterior per layer), and its cost — L/N of a
target step per drafted token — by the expected tokens per millisecond; untried candidates are
tried first. Needs a runtime that can exit early (``native``).
"""

from __future__ import annotations

import torch

from quickdraft.costs import CostModel
from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftStep, KeepDrafting
from quickdraft.errors import ConfigError
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.sampling import SamplingParams, choose_tokens, logits_to_probs

CANDIDATE_FRACTIONS = (0.25, 0.5, 0.75)  # exit layers tried, as fractions of the target's depth
TRIES_PER_CANDIDATE = 2


class EarlyExitDrafter(Drafter):
    target_cost_fraction = CANDIDATE_FRACTIONS[1]  # typical: the middle candidate
    max_rows = 1  # it drafts into the one request's target cache

    def __init__(self, target: Runtime, candidate_layers: list[int]) -> None:
        self.target = target
        self.candidates = candidate_layers
        self.accepted = dict.fromkeys(candidate_layers, 0.0)  # per exit layer, across requests
        self.rejected = dict.fromkeys(candidate_layers, 0.0)
        self.tries = dict.fromkeys(candidate_layers, 0)
        self.cache: KVCache | None = None
        self.cost_model: CostModel | None = None
        self.exit_layer = candidate_layers[-1]  # of the last proposal

    @classmethod
    def create(cls, target: Runtime, draft: Runtime | None, options: DrafterOptions) -> EarlyExitDrafter:
        if not target.supports_early_exit:
            raise ConfigError(
                f"the early-exit drafter drafts with the target's own first layers; the {target.name} runtime "
                f"cannot exit early (use --runtime native)"
            )
        layers = sorted({max(1, min(target.num_layers - 1, round(f * target.num_layers))) for f in CANDIDATE_FRACTIONS})
        return cls(target, layers)

    def bind(self, target_cache: KVCache, cost_model: CostModel | None) -> None:
        self.cache = target_cache
        self.cost_model = cost_model

    def acceptance_rate(self, layer: int) -> float:
        return (1.0 + self.accepted[layer]) / (2.0 + self.accepted[layer] + self.rejected[layer])

    def choose_exit_layer(self, num_tokens: int) -> int:
        """The candidate with the most expected tokens per unit of time at this γ (untried ones first)."""
        untried = [layer for layer in self.candidates if self.tries[layer] < TRIES_PER_CANDIDATE]
        if untried:
            return untried[-1]
        target_ms = self.cost_model.target if self.cost_model is not None else (lambda k: 1.0)

        def goodput(layer: int) -> float:
            draft_ms = layer / self.target.num_layers * target_ms(1)
            costs = CostModel({1: target_ms(1), num_tokens + 1: target_ms(num_tokens + 1)}, draft_ms)
            return costs.goodput(self.acceptance_rate(layer), num_tokens)

        return max(self.candidates, key=goodput)

    def propose(
        self,
        context_ids: list[list[int]],
        num_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
        copies: bool = True,
    ) -> DraftProposal:
        if self.cache is None:
            raise RuntimeError("the early-exit drafter drafts into the target's cache: bind() it first")
        self.check_rows(context_ids)
        (context,) = context_ids  # [T]
        num_tokens = min(num_tokens, self.target.max_context - len(context))
        if num_tokens <= 0:
            return DraftProposal.empty(1)
        self.exit_layer = layer = self.choose_exit_layer(num_tokens)
        position = len(context) - 1  # the last committed token: the target's cache holds everything before it
        token = torch.tensor([[context[-1]]])
        drafted: list[torch.Tensor] = []
        draft_probs: list[torch.Tensor] = []
        for step in range(num_tokens):
            logits = self.target.forward_early_exit(token, self.cache, position + step, layer)[:, -1]  # [1, V]
            probs = logits_to_probs(logits, sampling)  # [1, V]
            token = choose_tokens(probs, sampling, generator, position=len(context) + step)[:, None]  # [1, 1]
            drafted.append(token[:, 0])
            draft_probs.append(probs)
            if keep_drafting is not None and not keep_drafting(DraftStep(logits, None, step + 1)):
                break
        return DraftProposal(token_ids=torch.stack(drafted, dim=1), probs=torch.stack(draft_probs, dim=1))

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.tries[self.exit_layer] += 1
        self.accepted[self.exit_layer] += accepted
        self.rejected[self.exit_layer] += 1 if accepted < proposed else 0

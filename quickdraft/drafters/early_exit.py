"""``early-exit``: self-speculation with the target's own first layers (DEL-style dynamic exit layer).

A draft token is the target's first L layers, then its final norm and LM head: no second model,
and the keys and values those layers write go straight into the target's own cache (the
verify forward over the same positions overwrites them with identical values for those layers
and fills in the rest). The exit layer is chosen before each step among a few candidates from
each one's acceptance, tracked online (a Beta posterior per layer), and its cost — L/N of a
target step per drafted token — by the expected tokens per millisecond; untried candidates are
tried first. Needs a runtime that can exit early (``native``). A step drafts request by request, each into its
own target cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.costs import CostModel
from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
from quickdraft.drafters.records import DrafterRecords
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import draw, logits_to_scores
from quickdraft.policies import DraftStep
from quickdraft.runtime.base import KVCache, Runtime

CANDIDATE_FRACTIONS = (0.25, 0.5, 0.75)  # exit layers tried, as fractions of the target's depth
TRIES_PER_CANDIDATE = 2


@dataclass(eq=False)
class EarlyExitState(DraftState):
    target_cache: KVCache  # the request's target cache, which drafting writes the first layers' keys into
    exit_layer: int  # the layer the request's last proposal exited at


class EarlyExitDrafter(Drafter):
    """Drafts request by request (each into its own target cache); what each exit layer achieves is learned
    across requests."""

    target_cost_fraction = CANDIDATE_FRACTIONS[1]  # typical: the middle candidate

    def __init__(self, target: Runtime, candidate_layers: list[int], records: DrafterRecords | None = None) -> None:
        super().__init__(records)
        self.target = target
        self.candidates = candidate_layers
        self.accepted = dict.fromkeys(candidate_layers, 0.0)  # per exit layer, across requests
        self.rejected = dict.fromkeys(candidate_layers, 0.0)
        self.tries = dict.fromkeys(candidate_layers, 0)

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> EarlyExitDrafter:
        if not target.supports_early_exit:
            raise ConfigError(
                f"the early-exit drafter drafts with the target's own first layers; the {target.name} runtime "
                f"cannot exit early: use the native runtime",
                "runtime",
            )
        layers = sorted({max(1, min(target.num_layers - 1, round(f * target.num_layers))) for f in CANDIDATE_FRACTIONS})
        return cls(target, layers, records)

    def start(self, prompt_ids: Sequence[int], target_cache: KVCache) -> EarlyExitState:
        return EarlyExitState(target_cache, self.candidates[-1])

    def acceptance_rate(self, layer: int) -> float:
        return (1.0 + self.accepted[layer]) / (2.0 + self.accepted[layer] + self.rejected[layer])

    def choose_exit_layer(self, num_tokens: int) -> int:
        """The candidate with the most expected tokens per unit of time at this γ (untried ones first)."""
        untried = [layer for layer in self.candidates if self.tries[layer] < TRIES_PER_CANDIDATE]
        if untried:
            return untried[-1]
        cost_model = self.records.cost_model
        target_ms = cost_model.target if cost_model is not None else (lambda k: 1.0)

        def goodput(layer: int) -> float:
            draft_ms = layer / self.target.num_layers * target_ms(1)
            costs = CostModel({1: target_ms(1), num_tokens + 1: target_ms(num_tokens + 1)}, draft_ms)
            return costs.goodput(self.acceptance_rate(layer), num_tokens)

        return max(self.candidates, key=goodput)

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        return [self._propose(task) for task in tasks]

    def _propose(self, task: DraftTask) -> DraftProposal:
        """Draft with the target's first layers into the request's own target cache (one request at a time)."""
        assert isinstance(task.state, EarlyExitState)
        context = task.context  # [T]
        num_tokens = min(task.num_tokens, self.target.max_context - len(context))
        if num_tokens <= 0:
            return DraftProposal.empty()
        task.state.exit_layer = layer = self.choose_exit_layer(num_tokens)
        position = len(context) - 1  # the last committed token: the target's cache holds everything before it
        token = torch.tensor([[context[-1]]])
        drafted: list[torch.Tensor] = []
        draft_probs: list[torch.Tensor] = []
        for step in range(num_tokens):
            logits = self.target.forward_early_exit(token, task.state.target_cache, position + step, layer)[:, -1]
            scores = logits_to_scores(logits, task.sampling)  # [1, V]
            tokens, probs = draw(scores, task.sampling, task.generator, position=len(context) + step)  # [1], [1, V]
            token = tokens[:, None]  # [1, 1]
            drafted.append(tokens)
            if probs is not None:  # q, exactly what is drawn from (unseeded): what block verification reads
                draft_probs.append(probs)
            if not task.keep_drafting(DraftStep(logits, None, step + 1)):
                break
        probs = torch.stack(draft_probs, dim=1) if draft_probs else None  # [1, γ, V]: unseeded sampling's q only
        return DraftProposal(token_ids=torch.stack(drafted, dim=1), probs=probs)

    def observe(self, state: DraftState, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        assert isinstance(state, EarlyExitState)
        self.tries[state.exit_layer] += 1
        self.accepted[state.exit_layer] += accepted
        self.rejected[state.exit_layer] += 1 if accepted < proposed else 0

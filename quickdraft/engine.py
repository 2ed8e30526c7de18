"""The speculative decoding loop: draft, verify in one target pass, accept, roll back."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters.base import Drafter, DraftProposal
from quickdraft.errors import PromptError
from quickdraft.memory import DrafterMemory
from quickdraft.policies import FixedPolicy, Policy, StepState, parse_policy
from quickdraft.runtime.base import Runtime
from quickdraft.sampling import choose_tokens, logits_to_probs, make_generator, position_noise
from quickdraft.stats import GenerationStats
from quickdraft.text import IncrementalDecoder
from quickdraft.verify import VerificationResult, coupled_verify, greedy_verify, rejection_sample


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]  # new tokens only, an end-of-sequence token included
    finish_reason: str  # "eos" | "length" | "stop"
    stats: GenerationStats


class GenerationStream:
    """Iterates over text deltas as tokens are committed; ``result`` is set at the end."""

    def __init__(self, steps: Generator[str, None, GenerationResult]) -> None:
        self._steps = steps
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        if self.result is None:  # a finished stream yields nothing more and keeps its result
            self.result = yield from self._steps

    def finish(self) -> GenerationResult:
        """Run to the end (reading no further deltas) and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result


def check_prompt(prompt_ids: list[int], config: GenerationConfig, max_context: int) -> None:
    """Raise ``PromptError`` for an empty prompt or one that leaves no room for ``max_new_tokens``."""
    if not prompt_ids:
        raise PromptError("the prompt is empty: give some text to continue")
    needed = len(prompt_ids) + config.max_new_tokens
    if needed > max_context:
        raise PromptError(
            f"the prompt has {len(prompt_ids)} tokens and max_new_tokens is {config.max_new_tokens}: "
            f"{needed} positions, but the model's context holds {max_context}; "
            f"shorten the prompt or lower max_new_tokens"
        )


def choose_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator, position: int
) -> torch.Tensor:
    """One token per row from ``[B, V]`` logits for sequence position ``position``, as plain decoding chooses it."""
    return choose_tokens(logits_to_probs(logits, sampling), sampling, generator, position)


def verify_drafts(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator,
    position: int,
) -> VerificationResult:
    """A request's acceptance rule; ``position``: the sequence position of the first draft.

    Greedy: drafts equal to the target's argmax. Seeded sampling: drafts equal to the target's
    Gumbel-max samples under the positions' noise, so the output is seeded plain decoding's whatever
    γ. Unseeded sampling: Leviathan rejection sampling.
    """
    if sampling.is_greedy:
        return greedy_verify(draft_token_ids, target_logits)
    target_probs = logits_to_probs(target_logits, sampling)  # [1, γ + 1, V]
    if sampling.is_seeded:
        positions = range(position, position + target_probs.shape[1])
        noise = position_noise(sampling.seed, positions, target_probs.shape[-1])  # [γ + 1, V]
        return coupled_verify(draft_token_ids, target_probs, noise[None])
    return rejection_sample(draft_token_ids, draft_probs, target_probs, generator)


def commit_tokens(
    step_tokens: list[int],
    committed: list[int],
    new_token_ids: list[int],
    decoder: IncrementalDecoder,
    eos_token_ids: frozenset[int],
    max_new_tokens: int,
) -> str | None:
    """Commit a step's tokens one by one (to ``committed``, ``new_token_ids`` and ``decoder``) up to the end of
    the answer: the finish reason ("eos", "stop", "length") where it ends, None while it goes on."""
    for token in step_tokens:
        committed.append(token)
        new_token_ids.append(token)
        decoder.add(token)
        if token in eos_token_ids:
            return "eos"
        if decoder.stopped:
            return "stop"
        if len(new_token_ids) == max_new_tokens:
            return "length"
    return None


class SpeculativeEngine:
    """Decodes one request (B = 1) with a target runtime and a drafter."""

    def __init__(
        self,
        target: Runtime,
        drafter: Drafter,
        tokenizer: Any,
        eos_token_ids: frozenset[int],
        memory: DrafterMemory | None = None,
        prepare: Callable[[GenerationConfig], None] | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.memory = memory if memory is not None else DrafterMemory()  # the drafter's, across requests
        self.prepare = prepare  # gets the memory ready for a request's policy (e.g. measures a cost model)

    def generate(
        self, prompt_ids: list[int], config: GenerationConfig, policy: Policy | None = None
    ) -> GenerationResult:
        return self.stream(prompt_ids, config, policy).finish()

    def stream(self, prompt_ids: list[int], config: GenerationConfig, policy: Policy | None = None) -> GenerationStream:
        """Decode ``prompt_ids``; ``policy`` overrides ``config.policy`` with a ready instance (e.g. to record)."""
        self.check_prompt(prompt_ids, config)  # fail at the call, not at the first next()
        return GenerationStream(self._run(list(prompt_ids), config, policy or self.make_policy(config)))

    def make_policy(self, config: GenerationConfig) -> Policy:
        """The request's policy; a drafter that never drafts gets plain steps whatever the policy."""
        if not self.drafter.proposes_drafts:
            return FixedPolicy(0)
        if self.prepare is not None:
            self.prepare(config)
        return parse_policy(config.policy).build(self.memory.policy_context(config, self.drafter.offers_copies))

    def check_prompt(self, prompt_ids: list[int], config: GenerationConfig) -> None:
        check_prompt(prompt_ids, config, self.target.max_context)

    def _run(
        self, prompt_ids: list[int], config: GenerationConfig, policy: Policy
    ) -> Generator[str, None, GenerationResult]:
        sampling = config.sampling
        generator = make_generator(sampling.seed)  # unseeded sampling draws from it; seeded, from position noise
        stats = GenerationStats()
        decoder = IncrementalDecoder(self.tokenizer, config.stop)
        committed = list(prompt_ids)  # prompt + new tokens; the target's cache holds all but the last
        new_token_ids: list[int] = []
        clock = time.perf_counter
        started = clock()

        # 1. Prefill: the target reads the prompt (its last position gives token 1); the drafter starts
        #    the request (a draft model reads the prompt lazily, at its first draft).
        cache = self.target.new_cache(1)
        logits = self.target.forward(torch.tensor([prompt_ids]), cache, last_only=True)  # [1, 1, V]
        first_token = int(self._choose(logits[:, -1], sampling, generator, position=len(prompt_ids))[0])
        policy.observe_plain(logits[:, -1])
        self.drafter.prefill([prompt_ids])
        self.drafter.bind(cache, self.memory.cost_model)
        stats.target_forwards += 1
        stats.prefill_s = clock() - started
        step_tokens = [first_token]
        step_started, num_proposed, num_accepted = None, 0, 0  # the step being committed: its start and drafts

        while True:
            # 2. Commit the step's tokens; stop at end of sequence, a stop string or the budget. Then account
            #    for the step's drafts as far as they were committed.
            num_before = len(new_token_ids)
            finish_reason = commit_tokens(
                step_tokens, committed, new_token_ids, decoder, self.eos_token_ids, config.max_new_tokens
            )
            num_committed = len(new_token_ids) - num_before
            stats.new_tokens = len(new_token_ids)
            stats.step_sizes.append(num_committed)
            stats.step_times_s.append(clock() - started)
            if step_started is not None:  # a verified step (not the prefill's token)
                num_judged, num_kept = committed_drafts(num_proposed, num_accepted, num_committed)
                stats.draft_tokens_proposed += num_proposed
                stats.draft_tokens_accepted += num_kept
                policy.observe(num_judged, num_kept)
                self.drafter.observe(num_judged, num_kept)
                policy.observe_step_time(num_proposed, 1000 * (clock() - step_started))
            if finish_reason:
                break
            if delta := decoder.release():
                yield delta

            # 3. The policy chooses γ (0 = a plain step); draft up to γ tokens after the last committed one.
            tick = step_started = clock()
            remaining_tokens = config.max_new_tokens - len(new_token_ids)
            state = StepState(
                remaining_tokens=remaining_tokens,
                drafter_backlog=self.drafter.backlog([committed]),
                generated_tokens=len(new_token_ids),
                free_drafts=self.drafter.free_drafts([committed]),
            )
            bid = policy.bid(state)
            num_drafts = min(bid.num_draft_tokens, remaining_tokens - 1)
            stats.gamma_per_step.append(num_drafts)
            proposal = (
                self.drafter.propose([committed], num_drafts, sampling, generator, policy.keep_drafting, bid.copies)
                if num_drafts > 0
                else DraftProposal.empty(1)
            )
            draft_token_ids = proposal.token_ids  # [1, γ]
            stats.proposed_per_step.append(proposal.num_tokens)
            num_proposed = proposal.num_tokens
            stats.draft_s += clock() - tick

            # 4. Score the last committed token and the γ drafts in one target forward.
            tick = clock()
            block = torch.cat([torch.tensor([[committed[-1]]]), draft_token_ids], dim=1)  # [1, γ + 1]
            target_logits = self.target.forward(block, cache)  # [1, γ + 1, V]
            stats.target_forwards += 1

            # 5. Accept the longest correct prefix of drafts plus one token of the target's own.
            result = self._verify(draft_token_ids, proposal.probs, target_logits, sampling, generator, len(committed))
            num_accepted = int(result.num_accepted[0])
            if proposal.num_tokens == 0:
                policy.observe_plain(target_logits[:, -1])

            # 6. Roll the target's cache back past the rejected drafts (the drafter rolls back lazily).
            cache.truncate(len(committed) + num_accepted)
            stats.verify_s += clock() - tick
            step_tokens = result.committed_token_ids(draft_token_ids)

        stats.wall_time_s = clock() - started
        policy.observe_end(len(new_token_ids), cut_by_budget=finish_reason == "length")
        if delta := decoder.release(final=True):
            yield delta
        return GenerationResult(text=decoder.text, token_ids=new_token_ids, finish_reason=finish_reason, stats=stats)

    _choose = staticmethod(choose_token)
    _verify = staticmethod(verify_drafts)


def committed_drafts(num_proposed: int, num_accepted: int, num_committed: int) -> tuple[int, int]:
    """(judged, accepted) drafts of a step that committed only its first ``num_committed`` tokens.

    A step commits its accepted drafts, then the target's token. When the answer stops at an accepted
    draft (end of sequence, a stop string), the drafts after it never reach the answer: like drafts
    after a rejection, they count as neither judged nor accepted.
    """
    if num_committed > num_accepted:  # the target's token was committed: every verdict stands
        return num_proposed, num_accepted
    return num_committed, num_committed

"""Continuous batching: many requests decoded together, each with its own speculation.

Every step, each running request either reads a chunk of its prompt or drafts γ_i tokens (0 allowed); one
target forward scores every request's last committed token and drafts side by side with the prompt chunks
(:meth:`Runtime.forward_batch`), and each request keeps the drafts its own acceptance rule accepts, exactly as
:class:`quickdraft.engine.SpeculativeEngine` does for one request. On the native runtime a request's logits
are bitwise those of decoding it alone, so its greedy and seeded output do not depend on what else runs.
Requests join and leave at step boundaries. Goodput requests' γ are chosen together for the whole step
(:func:`quickdraft.policies.plan_batch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from quickdraft.costs import BatchCostModel
from quickdraft.drafters import DRAFTERS
from quickdraft.drafters.base import DrafterOptions, DraftProposal
from quickdraft.drafters.draft_model import DraftCache
from quickdraft.engine import (
    GenerationResult,
    check_prompt,
    choose_token,
    commit_tokens,
    committed_drafts,
    verify_drafts,
)
from quickdraft.errors import ConfigError
from quickdraft.memory import DrafterMemory
from quickdraft.policies import DraftBid, FixedPolicy, StepState, parse_policy, plan_batch
from quickdraft.runtime.base import BatchRow, Runtime
from quickdraft.sampling import make_generator, top_probability
from quickdraft.serving.drafting import BatchDrafter
from quickdraft.serving.request import (
    RequestFinished,
    RequestState,
    ServeRequest,
    Sink,
    TokenDelta,
)
from quickdraft.serving.scheduler import Scheduler, SchedulerSettings
from quickdraft.text import IncrementalDecoder

CONFIDENCE_ROWS_PER_STEP = 4  # requests whose policy hears the target's confidence in a step


@dataclass(frozen=True)
class StepReport:
    """What one step did (for metrics)."""

    decoding: int  # requests that drafted and verified
    prefill_tokens: int  # prompt tokens read
    gammas: tuple[int, ...]  # γ chosen per decoding request
    proposed: int  # drafts proposed, all requests
    accepted: int  # drafts committed
    new_tokens: int  # tokens committed, all requests
    finished: int
    running: int
    waiting: int
    seconds: float


@dataclass
class StepPlan:
    chunks: list[tuple[RequestState, int]] = field(default_factory=list)  # (request, prompt tokens to read)
    gammas: dict[RequestState, int] = field(default_factory=dict)  # decoding requests and their γ
    copying: set[RequestState] = field(default_factory=set)  # requests whose drafts are copies from their context


class BatchEngine:
    """Decodes many requests together; :meth:`submit` from any thread, :meth:`step` on one."""

    def __init__(
        self,
        target: Runtime,
        tokenizer: Any,
        eos_token_ids: frozenset[int],
        draft: Runtime | None = None,
        memories: Mapping[str, DrafterMemory] | None = None,
        batch_costs: BatchCostModel | None = None,
        settings: SchedulerSettings | None = None,
        options: DrafterOptions | None = None,
    ) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.draft = draft
        self.memories = dict(memories or {})  # per drafter: acceptance record, answer lengths, cost model
        self.batch_costs = batch_costs  # the measured batch curve goodput plans shared steps with
        self.scheduler = Scheduler(settings or SchedulerSettings())
        self.drafter = BatchDrafter(
            draft, target.vocab_size, options or DrafterOptions(), self.scheduler.settings.prefill_tokens_per_step
        )
        self.on_step: Callable[[StepReport], None] | None = None
        self.steps = 0  # steps taken

    # -- requests --------------------------------------------------------------------------------------

    def submit(self, request: ServeRequest, sink: Sink) -> None:
        """Queue ``request``; its events go to ``sink`` on the engine's thread. Bad requests raise here
        (``PromptError``, ``ConfigError``), a full queue raises ``QueueFull``."""
        config = request.config
        check_prompt(list(request.prompt_ids), config, self.target.max_context)
        if DRAFTERS.get(request.drafter).needs_draft_model and self.draft is None:
            raise ConfigError(f"the {request.drafter} drafter needs a draft model, and none is loaded")
        state = RequestState(
            request=request,
            sink=sink,
            policy=self._make_policy(request),
            generator=make_generator(config.sampling.seed),
            decoder=IncrementalDecoder(self.tokenizer, config.stop),
            committed=list(request.prompt_ids),
        )
        self.scheduler.add(state)

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step boundary and free its caches; it ends with finish reason "cancelled"."""
        self.scheduler.cancel(request_id)

    def memory(self, drafter: str) -> DrafterMemory:
        return self.memories.setdefault(drafter, DrafterMemory())

    def _make_policy(self, request: ServeRequest) -> Any:
        if not DRAFTERS.get(request.drafter).proposes_drafts:
            return FixedPolicy(0)
        spec = parse_policy(request.config.policy)  # type: ignore[arg-type]
        memory = self.memory(request.drafter)
        if spec.kind.needs_cost_model and memory.cost_model is None:
            raise ConfigError(f"the {spec.name} policy needs the {request.drafter} drafter's measured costs")
        if spec.kind.needs_cost_model and self.batch_costs is None:
            raise ConfigError(f"the {spec.name} policy needs the measured batch costs to share steps")
        return spec.build(memory.policy_context(request.config, DRAFTERS.get(request.drafter).offers_copies))

    @property
    def idle(self) -> bool:
        return self.scheduler.idle

    def run_until_idle(self) -> None:
        """Step until every submitted request has finished (a library caller's or a test's loop)."""
        while self.step() is not None:
            pass

    # -- the step loop ---------------------------------------------------------------------------------

    def step(self) -> StepReport | None:
        """One step for every running request; None when there is nothing to do."""
        started = time.perf_counter()
        self.steps += 1
        # 1. Drop cancelled requests (their caches go with them) and admit waiting ones into free slots.
        for state in self.scheduler.take_cancelled():
            self._finish(state, "cancelled")
        admitted = self.scheduler.admit()
        for state in admitted:
            self._start(state)
        if any(state.draft_cache is not None for state in admitted):
            self.drafter.focus(self.scheduler.running)
        if not self.scheduler.running:
            return None

        # 2. Plan: prompt chunks within the step's budget; γ per decoding request, from its policy's bid, goodput
        #    bids trimmed together to what pays in this step.
        plan = self._plan()

        # 3. Draft for every decoding request: batched draft-model forwards, prompt lookup per request.
        alone = len(plan.gammas) == 1 and not plan.chunks  # a step like the single-request engine's
        proposals = self.drafter.propose(plan.gammas, plan.copying, alone)

        # 4. One target forward over every decoding request's last token and drafts and every prompt chunk.
        decoding = list(plan.gammas)
        rows = [
            BatchRow(state.cache, [state.committed[-1], *proposals[state].token_ids[0].tolist()]) for state in decoding
        ]
        rows += [
            BatchRow(state.cache, state.committed[state.prefilled :][:n], last_only=True) for state, n in plan.chunks
        ]
        logits = self.target.forward_batch(rows) if rows else []

        # 5. Accept per request, roll its target cache back past rejected drafts; commit and stream.
        new_tokens = proposed = accepted = finished = 0
        plain_logits: list[tuple[RequestState, torch.Tensor]] = []  # [1, V] each: tokens chosen without drafts
        for state, target_logits in zip(decoding, logits, strict=False):
            kept, committed = self._accept(state, proposals[state], target_logits, started, alone)
            proposed, accepted = proposed + proposals[state].num_tokens, accepted + kept
            new_tokens, finished = new_tokens + committed, finished + (state.cache is None)
            if proposals[state].num_tokens == 0:
                plain_logits.append((state, target_logits[-1:]))

        # 6. A request whose prompt is now read commits its first token, from the prompt's last position.
        for (state, n), chunk_logits in zip(plan.chunks, logits[len(decoding) :], strict=True):
            state.prefilled += n
            if state.prefilled == state.prompt_length:
                new_tokens, finished = new_tokens + 1, finished + self._first_token(state, chunk_logits, started)
                plain_logits.append((state, chunk_logits))

        # 7. Policies that learn from the target's confidence after plain tokens hear it, a few requests a step.
        self._observe_confidence([(state, row) for state, row in plain_logits if state.cache is not None])
        report = StepReport(
            decoding=len(decoding),
            prefill_tokens=sum(n for _, n in plan.chunks),
            gammas=tuple(plan.gammas.values()),
            proposed=proposed,
            accepted=accepted,
            new_tokens=new_tokens,
            finished=finished,
            running=len(self.scheduler.running),
            waiting=self.scheduler.num_waiting,
            seconds=time.perf_counter() - started,
        )
        if self.on_step is not None:
            self.on_step(report)
        return report

    def _start(self, state: RequestState) -> None:
        state.cache = self.target.new_cache(1)
        if DRAFTERS.get(state.request.drafter).needs_draft_model and self.draft is not None:
            state.draft_cache = DraftCache(self.draft.new_cache(1))

    def _plan(self) -> StepPlan:
        plan = StepPlan(chunks=self.scheduler.prefill_chunks())
        decoding = [state for state in self.scheduler.running if state.decoding]
        bids: list[DraftBid] = []
        uses_draft_model: list[bool] = []  # drafts with the draft model this step (not copies)
        for state in decoding:
            remaining_tokens = state.request.config.max_new_tokens - len(state.new_token_ids)
            free_drafts = self.drafter.free_drafts(state)
            step_state = StepState(remaining_tokens, self.drafter.backlog(state), len(state.new_token_ids), free_drafts)
            bid = state.policy.bid(step_state)  # a step never drafts past the request's budget
            bids.append(replace(bid, num_draft_tokens=min(bid.num_draft_tokens, remaining_tokens - 1)))
            if free_drafts > 0 and bid.copies:
                plan.copying.add(state)
            uses_draft_model.append(state.draft_cache is not None and state not in plan.copying)
        gammas = [bid.num_draft_tokens for bid in bids]
        # Bids exist only while some request decodes, and then prompt chunks keep to the step's budget (the
        # scheduler reads a prompt whole only when none decodes): other_tokens stays within the measured curve.
        if self.batch_costs is not None and any(bid.negotiable for bid in bids):
            other_tokens = sum(n for _, n in plan.chunks)
            gammas = plan_batch(bids, uses_draft_model, self.batch_costs, other_tokens)
        plan.gammas = dict(zip(decoding, gammas, strict=True))
        for state, gamma in plan.gammas.items():
            state.stats.gamma_per_step.append(gamma)
        return plan

    def _accept(
        self, state: RequestState, proposal: DraftProposal, target_logits: torch.Tensor, started: float, single: bool
    ) -> tuple[int, int]:
        """Verify a decoding request's drafts and commit; (drafts kept, tokens committed)."""
        config, draft_token_ids = state.request.config, proposal.token_ids  # [1, γ]
        result = verify_drafts(
            draft_token_ids,
            proposal.probs,
            target_logits[None],  # [1, γ + 1, V]
            config.sampling,
            state.generator,
            len(state.committed),
        )
        num_accepted = int(result.num_accepted[0])
        state.cache.truncate(len(state.committed) + num_accepted)  # type: ignore[union-attr]
        state.stats.target_forwards += 1
        state.stats.proposed_per_step.append(proposal.num_tokens)
        num_committed = self._commit(state, result.committed_token_ids(draft_token_ids))
        num_judged, num_kept = committed_drafts(proposal.num_tokens, num_accepted, num_committed)
        state.stats.draft_tokens_proposed += proposal.num_tokens
        state.stats.draft_tokens_accepted += num_kept
        state.policy.observe(num_judged, num_kept)
        if single and state not in self.drafter.only_read:  # a step like the single engine's times its steps
            state.policy.observe_step_time(proposal.num_tokens, 1000 * (time.perf_counter() - started))
        return num_kept, num_committed

    def _observe_confidence(self, rows: list[tuple[RequestState, torch.Tensor]]) -> None:
        """The policies of these requests, whose tokens were chosen without drafts, hear the target's top probability
        at their ``[1, V]`` logits if they want it: at most :data:`CONFIDENCE_ROWS_PER_STEP` a step, those that
        heard it longest ago first. Each is a pass of exp over the vocabulary, about 0.14 ms: for every request of
        a busy batch that was as much as goodput's bids and batch plan together, for an estimate that only steadies
        over many steps anyway."""
        rows = [(state, logits) for state, logits in rows if state.policy.wants_confidence()]
        rows = sorted(rows, key=lambda row: row[0].confidence_step)[:CONFIDENCE_ROWS_PER_STEP]
        for state, logits in rows:
            state.confidence_step = self.steps
            state.policy.observe_confidence(float(top_probability(logits)))

    def _first_token(self, state: RequestState, logits: torch.Tensor, started: float) -> bool:
        """Commit the first token from the prompt's last position ``[1, V]``; True if the request ended."""
        sampling = state.request.config.sampling
        first_token = int(choose_token(logits, sampling, state.generator, position=state.prompt_length)[0])
        state.stats.target_forwards += 1
        state.stats.prefill_s = time.perf_counter() - state.submitted
        self._commit(state, [first_token])
        return state.cache is None

    def _commit(self, state: RequestState, step_tokens: list[int]) -> int:
        """Commit a step's tokens and stream them; finish the request at its end. Returns the tokens committed."""
        num_before = len(state.new_token_ids)
        finish_reason = commit_tokens(
            step_tokens,
            state.committed,
            state.new_token_ids,
            state.decoder,
            self.eos_token_ids,
            state.request.config.max_new_tokens,
        )
        committed = state.new_token_ids[num_before:]
        state.stats.new_tokens = len(state.new_token_ids)
        state.stats.step_sizes.append(len(committed))
        state.stats.step_times_s.append(time.perf_counter() - state.submitted)
        if finish_reason is not None:
            self.scheduler.finish(state)
            self._finish(state, finish_reason, committed)
        elif committed:
            state.sink(TokenDelta(state.decoder.release(), tuple(committed)))
        return len(committed)

    def _finish(self, state: RequestState, finish_reason: str, last_tokens: list[int] | None = None) -> None:
        state.release()
        state.stats.wall_time_s = time.perf_counter() - state.submitted
        if finish_reason != "cancelled":
            state.policy.observe_end(len(state.new_token_ids), cut_by_budget=finish_reason == "length")
        final_text = state.decoder.release(final=True)
        if final_text or last_tokens:
            state.sink(TokenDelta(final_text, tuple(last_tokens or ())))
        result = GenerationResult(state.decoder.text, state.new_token_ids, finish_reason, state.stats)
        state.sink(RequestFinished(result))

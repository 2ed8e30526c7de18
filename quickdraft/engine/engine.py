"""The one speculative decoding loop, for one request and for many: a request alone is a batch of one.

Every step, each running request either reads a chunk of its prompt or drafts γ_i tokens (0 allowed) with its
own drafter and policy; one target forward scores every request's last committed token and drafts side by side
with the prompt chunks (:meth:`Runtime.forward_batch`), and each request keeps the drafts its own acceptance
rule accepts (:mod:`quickdraft.lossless.rules`). On the native runtime a request's logits are bitwise those of
decoding it alone, so its greedy and seeded output do not depend on what else runs. Requests join and leave at
step boundaries. Goodput requests' γ are chosen together for the whole step (:func:`plan_step`).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from quickdraft.costs import BatchCostModel
from quickdraft.drafters import Drafter, DraftProposal, DraftTask
from quickdraft.engine.features import target_forward
from quickdraft.engine.logprobs import token_logprobs
from quickdraft.engine.prefix_cache import PrefixCache
from quickdraft.engine.request import (
    FailureCause,
    Request,
    RequestFailed,
    RequestFinished,
    RequestState,
    RunningRequest,
    Sink,
    check_drafter,
    hear_confidence,
    request_policy,
)
from quickdraft.engine.scheduler import Scheduler, SchedulerSettings
from quickdraft.engine.step import StepLock, StepPlan, StepReport, plan_requests
from quickdraft.errors import ConfigError
from quickdraft.grammar import GrammarCompiler, GrammarDeadEnd
from quickdraft.lossless.rules import (
    check_prompt,
    check_token_ids,
    choose_token,
    commit_tokens,
    committed_drafts,
    verify_drafts,
)
from quickdraft.lossless.sampling import make_generator
from quickdraft.policies import DraftBid, StepOutcome
from quickdraft.runtime.base import BatchRow, Runtime
from quickdraft.text import IncrementalDecoder

EMPTY = torch.empty(1, 0, dtype=torch.long)  # no drafts  [1, 0]


class Engine:
    """Decodes requests with a target runtime: :meth:`submit` from any thread and :meth:`step` on one
    (:func:`quickdraft.engine.stream.stream` decodes one request on the caller's thread)."""

    def __init__(
        self,
        target: Runtime,
        tokenizer: Any,
        eos_token_ids: frozenset[int],
        settings: SchedulerSettings | None = None,
        batch_costs: BatchCostModel | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        if prefix_cache is not None and not target.reusable_prefixes:
            raise ConfigError(f"prefix caching needs a runtime whose cached prefixes are exact; {target.name} is not")
        self.prefix_cache = prefix_cache  # finished requests' caches, taken over by prompts that start alike
        self.target, self.tokenizer, self.eos_token_ids = target, tokenizer, eos_token_ids
        self.batch_costs = batch_costs  # the measured batch curve goodput plans shared steps with (None: bids stand)
        self.scheduler = Scheduler(settings or SchedulerSettings())
        self.on_step: Any = None  # called with every StepReport
        self.step_lock = StepLock()  # held by the thread that steps, and by one that measures costs meanwhile
        self.steps = 0  # steps taken

    def submit(self, request: Request, sink: Sink) -> None:
        """Queue ``request``; its events go to ``sink`` on the engine's thread. Bad requests raise here
        (``PromptError``, ``ConfigError``), a full queue raises ``QueueFull``."""
        self.enqueue(self.new_state(request, sink))

    def new_state(self, request: Request, sink: Sink) -> RequestState:
        """A checked request's state, its policy built, ready to :meth:`enqueue`; bad requests raise."""
        self.check_request(request)
        config = request.config
        return RequestState(
            constraint=None if (grammar := config.grammar) is None else self._grammars.constraint(grammar),
            request=request,
            sink=sink,
            policy=request_policy(request, self.step_lock.between_steps) if request.policy is None else request.policy,
            generator=make_generator(config.sampling.seed, self.target.device),
            decoder=IncrementalDecoder(
                self.tokenizer, config.stop, config.min_tokens, config.kept_special_tokens, request.prompt_ids
            ),
            committed=list(request.prompt_ids),
            eos_token_ids=self.eos_token_ids,
        )

    def enqueue(self, state: RequestState) -> None:
        state.submitted = time.perf_counter()
        self.scheduler.add(state)

    def cancel(self, request_id: str, now: bool = False) -> None:
        """Stop a request at the next step boundary; it ends with reason "cancelled". ``now``: free its caches on the
        caller's thread, unless a step is running (whose end frees them)."""
        self.scheduler.cancel(request_id)
        if now:
            with self.step_lock.stepping(blocking=False) as held:
                if held:
                    self._drop_cancelled()

    def _drop_cancelled(self) -> None:
        """End the cancelled requests, freeing their caches; the caller holds :attr:`step_lock`."""
        for state in self.scheduler.take_cancelled():
            self._finish(state, "cancelled")

    def check_request(self, request: Request) -> None:
        """Raise for a request that cannot run: its prompt's fit and ids, its prediction's ids and drafter."""
        check_drafter(request, self.target)
        check_prompt(request.prompt_ids, request.config, self.target.max_context, self.target.vocab_size)
        check_token_ids(request.prediction_ids, self.target.vocab_size, "prediction")

    @functools.cached_property
    def _grammars(self) -> GrammarCompiler:  # made on the first request with a grammar
        return GrammarCompiler(self.tokenizer, self.target.vocab_size, self.eos_token_ids)

    @property
    def idle(self) -> bool:
        return self.scheduler.idle

    def run_until_idle(self) -> None:
        """Step until every submitted request has finished (a library caller's or a test's loop)."""
        while self.step() is not None:
            pass

    def drop_all(self) -> list[RequestState]:
        """Remove every request, running or waiting (the server is stopping), and return them."""
        return [*self.fail_running(), *self.scheduler.take_waiting()]

    def fail_running(self) -> list[RequestState]:
        """Drop every running request after a failed step (their caches may be half-written, and go with them),
        and any whose admission failed; returns them."""
        failed = self.scheduler.take_all()
        for state in failed:
            if isinstance(state, RunningRequest):
                state.finished = True
        return failed

    # -- the step loop ---------------------------------------------------------------------------------

    def step(self) -> StepReport | None:
        """One step for every running request; None when there is nothing to do. One thread steps at a time (others
        wait their turn). A step that raises fails the requests it ran, whose caches may be half-written: each
        hears ``RequestFailed``, the others wait on, and the exception goes on to the caller."""
        with self.step_lock.stepping():
            try:
                return self._step()
            except BaseException as error:
                message = f"a step failed while this request ran ({type(error).__name__}): it was dropped"
                for state in self.fail_running():
                    state.sink(RequestFailed(message))
                raise

    def _step(self) -> StepReport | None:
        started = time.perf_counter()
        self.steps += 1
        # 1. Drop cancelled requests (their caches go with them) and admit waiting ones into free slots: each
        #    gets a target cache and its drafter's state.
        self._drop_cancelled()
        admitted = self.scheduler.admit(self._start)
        if any(state.request.drafter.needs_draft_model for state in admitted):
            self._focus()
        if not self.scheduler.running:
            return None

        # 2. Plan: prompt chunks within the step's budget; γ per decoding request, from its policy's bid, goodput
        #    bids trimmed together to what pays in this step.
        plan = plan_requests(self.scheduler.running, self.scheduler.prefill_chunks(), self.batch_costs)

        # 3. Draft: each drafter proposes for its requests of the step together.
        tick = time.perf_counter()
        proposals = self._draft(plan)
        draft_s = time.perf_counter() - tick

        # 4. Verify: one target forward over every decoding request's last token and drafts and every prompt chunk.
        tick = time.perf_counter()
        decoding = list(plan.gammas)
        rows = [
            BatchRow(state.cache, [state.committed[-1], *proposals[state].token_ids[0].tolist()]) for state in decoding
        ]
        rows += [  # a prompt chunk's last row only, unless the request asked for its prompt's log-probabilities
            BatchRow(state.cache, state.committed[state.prefilled :][:n], not state.request.scores_prompt)
            for state, n in plan.chunks
        ]
        states = [*decoding, *(state for state, _ in plan.chunks)]
        logits, features = target_forward(self.target, rows, [state.request.drafter for state in states])
        forward_s = time.perf_counter() - tick

        # 5. Accept per request and roll its target cache back past rejected drafts; commit, stream, learn.
        new_tokens = proposed = accepted = finished = 0
        plain_logits: list[tuple[RunningRequest, torch.Tensor]] = []  # [1, V] each: tokens chosen without drafts
        for state, target_logits, row_features in zip(decoding, logits, features, strict=False):
            state.stats.draft_s += draft_s
            kept, committed = self._accept(
                state, plan.bids[state], proposals[state], target_logits, row_features, started if plan.alone else None
            )
            state.stats.verify_s += forward_s
            proposed, accepted = proposed + proposals[state].num_tokens, accepted + kept
            new_tokens, finished = new_tokens + committed, finished + state.finished
            if proposals[state].num_tokens == 0:
                plain_logits.append((state, target_logits[-1:]))

        # 6. A request whose prompt is now read commits its first token, from the prompt's last position.
        for (state, n), chunk_logits, chunk_features in zip(
            plan.chunks, logits[len(decoding) :], features[len(decoding) :], strict=True
        ):
            last_logits = state.read_prompt(chunk_logits, n)  # [1, V]
            if chunk_features is not None:
                state.request.drafter.observe_features(state.draft_state, chunk_features)
            if state.prefilled == state.prompt_length:
                new_tokens, finished = new_tokens + 1, finished + self._first_token(state, last_logits)
                plain_logits.append((state, last_logits))

        # 7. Policies that learn from the target's confidence after plain tokens hear it, a few requests a step.
        hear_confidence([(state, row) for state, row in plain_logits if not state.finished], self.steps)
        report = StepReport(
            decoding=len(decoding), prefill_tokens=sum(n for _, n in plan.chunks), gammas=tuple(plan.gammas.values()),
            proposed=proposed, accepted=accepted, new_tokens=new_tokens, finished=finished,
            running=len(self.scheduler.running), waiting=self.scheduler.num_waiting,
            seconds=time.perf_counter() - started,
        )  # fmt: skip
        if self.on_step is not None:
            self.on_step(report)
        return report

    def _start(self, state: RequestState) -> RunningRequest:
        """An admitted request running, with its drafter's state and its target cache: a finished request's with the
        longest shared start (prefix caching; not for drafters that read every position's features), else empty."""
        request, reused = state.request, None
        if self.prefix_cache is not None and request.reuses_prefix and not request.drafter.feature_layers:
            reused = self.prefix_cache.take(request.prompt_ids)
        cache, prefilled = reused or (self.target.new_cache(1), 0)
        running = RunningRequest.admit(state, cache, prefilled, request.drafter.start(request.prompt_ids, cache))
        running.stats.cached_prompt_tokens = prefilled
        if request.prediction_ids:
            request.drafter.expect(running.draft_state, request.prediction_ids)
        return running

    def _focus(self) -> None:
        """Drafters with a draft model share it: its LM head, where it computes part of the vocabulary, also
        computes the prompt tokens of every running request that drafts with it."""
        users = [state for state in self.scheduler.running if state.request.drafter.needs_draft_model]
        prompts = [state.request.prompt_ids for state in users]
        for drafter in {id(state.request.drafter): state.request.drafter for state in users}.values():
            drafter.focus(prompts)

    def _draft(self, plan: StepPlan) -> dict[RunningRequest, DraftProposal]:
        """Each drafting request's proposal (an empty one for γ = 0). A drafter drafts for all its requests of the
        step together; a draft model reads at most a prompt chunk's worth of backlog before drafting, unless the
        request is alone (there is no one for the reading to stall)."""
        proposals = {state: DraftProposal.empty() for state in plan.gammas}
        tasks: dict[Drafter, list[tuple[RunningRequest, DraftTask]]] = {}
        for state, gamma in plan.reach.items():
            state.stats.gamma_per_step.append(plan.gammas[state])  # the plan; a lone judged block may run past it
            bid = plan.bids[state]
            if gamma > 0 and bid.offer is not None:
                task = DraftTask(
                    state.draft_state,
                    tuple(state.committed),
                    gamma,
                    state.request.config.sampling,
                    state.generator,
                    bid.keep_drafting,
                    bid.offer,
                    None if state.constraint is None else state.constraint.cursor(),
                )
                tasks.setdefault(state.request.drafter, []).append((state, task))
        max_read_tokens = None if plan.alone else self.scheduler.settings.prefill_tokens_per_step
        for drafter, pairs in tasks.items():
            drafted = drafter.propose([task for _, task in pairs], max_read_tokens)
            proposals.update(zip([state for state, _ in pairs], drafted, strict=True))
        return proposals

    def _accept(
        self,
        state: RunningRequest,
        bid: DraftBid,
        proposal: DraftProposal,
        target_logits: torch.Tensor,
        features: torch.Tensor | None,
        step_started: float | None,
    ) -> tuple[int, int]:
        """Verify a decoding request's drafts (of its policy's ``bid``), commit, let its policy and drafter learn;
        (drafts kept, tokens committed). ``features``: the target's at the row's positions, for a drafter that reads
        them (it gets those of the positions kept). ``step_started``: when a step that held this request alone
        began (its policy learns what such a step takes); None otherwise."""
        config, tick = state.request.config, time.perf_counter()
        try:
            draft_token_ids, draft_probs, target_logits = state.target_choice(
                proposal.token_ids, proposal.probs, target_logits
            )  # [1, γ'], [1, γ', V] or None, [γ' + 1, V]: the drafts a grammar allows, the logits chosen from
        except GrammarDeadEnd as error:
            return self._fail(state, error)
        result = verify_drafts(
            draft_token_ids,
            draft_probs,
            target_logits[None],  # [1, γ + 1, V]
            config.sampling,
            state.generator,
            len(state.committed),
        )
        num_accepted = int(result.num_accepted[0])
        state.cache.truncate(len(state.committed) + num_accepted)
        if features is not None:  # the last committed token and the accepted drafts were read: their positions
            state.request.drafter.observe_features(state.draft_state, features[: num_accepted + 1])
        state.stats.verify_s += time.perf_counter() - tick
        state.stats.target_forwards += 1
        state.stats.proposed_per_step.append(proposal.num_tokens)
        committed_tokens, finish_reason = self._commit(state, result.committed_token_ids(draft_token_ids))
        num_judged, num_kept = committed_drafts(proposal.num_tokens, num_accepted, len(committed_tokens))
        state.stats.draft_tokens_proposed += proposal.num_tokens
        state.stats.draft_tokens_accepted += num_kept
        if proposal.predicted:
            state.stats.predicted_tokens_accepted += num_kept
        state.request.drafter.observe(state.draft_state, num_judged, num_kept)
        step_ms = None if step_started is None else 1000 * (time.perf_counter() - step_started)
        state.policy.observe(StepOutcome(bid, proposal.num_tokens, num_judged, num_kept, step_ms))
        self._deliver(state, committed_tokens, finish_reason, target_logits)
        return num_kept, len(committed_tokens)

    def _first_token(self, state: RunningRequest, logits: torch.Tensor) -> bool:
        """Commit the first token from the prompt's last position ``[1, V]``; True if the request ended."""
        try:
            sampling, logits = state.request.config.sampling, state.target_choice(EMPTY, None, logits)[2]
        except GrammarDeadEnd as error:
            self._fail(state, error)
            return True
        first_token = int(choose_token(logits, sampling, state.generator, position=state.prompt_length)[0])
        state.stats.target_forwards += 1
        state.stats.prefill_s = time.perf_counter() - state.submitted
        self._deliver(state, *self._commit(state, [first_token]), logits)
        return state.finished

    def _fail(self, state: RunningRequest, error: GrammarDeadEnd) -> tuple[int, int]:
        """End a request that cannot go on by its own fault, freeing its caches: (0, 0) drafts kept and tokens."""
        self.scheduler.finish(state)
        state.finished = True
        state.request.drafter.finish(state.draft_state)
        state.sink(RequestFailed(str(error), FailureCause.REQUEST))
        return 0, 0

    def _commit(self, state: RunningRequest, step_tokens: list[int]) -> tuple[list[int], str | None]:
        """Commit a step's tokens up to the end of the answer: (the tokens committed, the finish reason or None)."""
        num_before, limit, eos = len(state.new_token_ids), state.request.config.max_new_tokens, state.end_token_ids
        reason = commit_tokens(step_tokens, state.committed, state.new_token_ids, state.decoder, eos, limit)
        committed = state.new_token_ids[num_before:]
        if state.constraint is not None:  # the grammar moves past them
            state.constraint.accept(committed)
        state.stats.new_tokens = len(state.new_token_ids)
        state.stats.step_sizes.append(len(committed))
        state.stats.step_times_s.append(time.perf_counter() - state.submitted)
        return committed, reason

    def _deliver(
        self, state: RunningRequest, committed: list[int], finish_reason: str | None, logits: torch.Tensor
    ) -> None:
        """Stream what a step committed (with their log-probabilities from ``logits [≥ n, V]``, the rows of their
        positions, if the request asked for them); finish the request at its end."""
        config = state.request.config
        if config.logprobs is not None:
            state.logprobs.extend(token_logprobs(logits, committed, config.sampling, config.logprobs))
        if finish_reason is not None:
            self.scheduler.finish(state)
            self._finish(state, finish_reason, committed)
        elif committed:
            state.sink(state.delta(state.decoder.release(), committed))

    def _finish(
        self, state: RequestState | RunningRequest, finish_reason: str, last_tokens: list[int] | None = None
    ) -> None:
        if isinstance(state, RunningRequest):  # its caches: the drafter's released or kept, the target's kept
            state.finished = True
            state.request.drafter.finish(state.draft_state)
            if self.prefix_cache is not None and state.request.cache_prompt:
                self.prefix_cache.keep(state.committed, state.cache)
        state.stats.wall_time_s = time.perf_counter() - state.submitted
        if finish_reason != "cancelled":
            state.policy.observe_end(len(state.new_token_ids), cut_by_budget=finish_reason == "length")
        last = state.delta(state.decoder.release(final=True), last_tokens or (), final=True)
        if last.text or last.token_ids or last.logprobs or last.prompt_logprobs:
            state.sink(last)
        state.sink(RequestFinished(state.result(finish_reason)))

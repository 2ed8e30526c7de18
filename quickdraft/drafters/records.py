"""What one drafter learns and measures across requests, and where it is kept between processes.

A :class:`DrafterRecords` bundles a drafter's acceptance record, answer lengths, step times, cost
model and acceptance head: every drafter holds one (shared by drafters of the same name), and a
request's policy sees it through a :class:`PolicyContext`. Its learned part (acceptance and answer
lengths) is saved to a *learned file* so a process that serves one request (the CLI) begins where
earlier ones left off; runs that learn at the same time each add what they learned to it, under a
lock beside it.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quickdraft.config import GenerationConfig
from quickdraft.costs import CostModel
from quickdraft.files import exclusive_lock, lock_file, write_atomically
from quickdraft.policies import (
    AcceptanceRecord,
    AnswerLength,
    AnswerLengthRecord,
    BetaCounts,
    PolicyContext,
    StepTimeRecord,
)
from quickdraft.policies.acceptance_head import AcceptanceHead


@dataclass
class DrafterRecords:
    """One drafter's records, shared by its requests: what it learned of answers, what its steps cost."""

    acceptance: AcceptanceRecord = field(default_factory=AcceptanceRecord)  # first and later drafts accepted
    answer_lengths: AnswerLengthRecord = field(default_factory=AnswerLengthRecord)  # how long answers ran
    step_times: StepTimeRecord = field(default_factory=StepTimeRecord)  # what the engine's steps took
    cost_model: CostModel | None = None  # measured forward costs (goodput)
    acceptance_head: AcceptanceHead | None = None  # a trained SpecDec++ head
    synced: SyncPoint | None = field(default=None, init=False, repr=False)  # None: the learned records continue no file
    # How the costs are measured or loaded when first needed (γ up to the given most), set by whoever made the
    # drafter for its models (Pipeline.drafter); None: they are only what was given.
    measure_costs: Callable[[int], CostModel] | None = field(default=None, repr=False, compare=False)
    # the cost model last measured or loaded for these records; one a caller set instead is kept as given
    measured_costs: CostModel | None = field(default=None, init=False, repr=False, compare=False)

    def costs_needed(self, max_draft_tokens: int) -> bool:
        """Whether costs must be measured for a request that may verify ``max_draft_tokens`` drafts: there are none,
        or the measured ones stop short of its widest step (a cost model a caller set is used as it is)."""
        model = self.cost_model
        return model is None or (model is self.measured_costs and max(model.target_ms) < max_draft_tokens + 1)

    def use_measured_costs(self, cost_model: CostModel) -> None:
        """Plan with ``cost_model``, measured or loaded for these models."""
        self.cost_model = self.measured_costs = cost_model

    def ready_costs(self, max_draft_tokens: int) -> CostModel | None:
        """The cost model, measured or loaded on first need (later requests share it), and again for a request that
        may verify more drafts than it was measured for."""
        if self.measure_costs is not None and self.costs_needed(max_draft_tokens):
            self.use_measured_costs(self.measure_costs(max_draft_tokens))
        return self.cost_model

    def policy_context(self, config: GenerationConfig) -> PolicyContext:
        """What a request's policy may use: its γ settings and these records."""
        assert config.num_draft_tokens is not None  # resolved by GenerationConfig
        return PolicyContext(
            config.num_draft_tokens,
            config.max_draft_tokens,
            self.cost_model,
            self.acceptance,
            self.acceptance_head,
            self.step_times,
            self.answer_lengths,
        )

    def forget_answers(self) -> None:
        """Drop what was learned of earlier answers (acceptance, lengths); what steps cost stays measured.
        The next :meth:`save_learned` replaces the learned file instead of adding to it."""
        self.acceptance = AcceptanceRecord()
        self.answer_lengths = AnswerLengthRecord()
        self.synced = None

    def learned(self) -> dict[str, Any]:
        """The learned part as JSON-ready data."""
        return learned_json(self.acceptance, list(self.answer_lengths.answers))

    def load_learned(self, path: Path) -> int:
        """Start from the learned file at ``path``; how many answers it held (0: none yet, or a file that does
        not parse, which the next save replaces)."""
        acceptance, answers = read_learned(path) or (AcceptanceRecord(), [])
        self.acceptance = acceptance
        self.answer_lengths = AnswerLengthRecord(deque(answers))
        self.synced = SyncPoint(copy.deepcopy(acceptance), self.answer_lengths.num_added)
        return len(self.answer_lengths.answers)

    def save_learned(self, path: Path) -> None:
        """Add what was learned since :meth:`load_learned` (or the last save) to the learned file at ``path``,
        re-read under its lock, so runs that learn at the same time all keep what they learned; learning
        afresh (:meth:`forget_answers`) replaces the file. A file that cannot be written only means the next
        process starts knowing less."""
        with contextlib.suppress(OSError), exclusive_lock(lock_file(path)):
            write_atomically(path, json.dumps(learned_json(*self._learned_to_save(path))))
            self.synced = SyncPoint(copy.deepcopy(self.acceptance), self.answer_lengths.num_added)

    def _learned_to_save(self, path: Path) -> tuple[AcceptanceRecord, list[AnswerLength]]:
        """What the learned file at ``path`` is to hold: what it holds now plus what these records learned since
        they last agreed with it; these records alone when they do not continue it."""
        answers = list(self.answer_lengths.answers)
        if self.synced is None:
            return self.acceptance, answers
        on_disk, answers_on_disk = read_learned(path) or (AcceptanceRecord(), [])
        acceptance = AcceptanceRecord(
            added_counts(on_disk.first, self.acceptance.first, self.synced.acceptance.first),
            added_counts(on_disk.later, self.acceptance.later, self.synced.acceptance.later),
        )
        answers = answers_on_disk + self.answer_lengths.added_since(self.synced.num_answers_added)
        return acceptance, answers[-self.answer_lengths.capacity :]


@dataclass(frozen=True)
class SyncPoint:
    """Where the learned records last agreed with its learned file: what was learned after it is
    what the next save adds to the file."""

    acceptance: AcceptanceRecord  # the acceptance counts then
    num_answers_added: int  # the answer record's ``num_added`` then


def added_counts(on_disk: BetaCounts, now: BetaCounts, then: BetaCounts) -> BetaCounts:
    """``on_disk`` plus what was counted between ``then`` and ``now`` (counts only grow; never below 0)."""
    return BetaCounts(
        max(0.0, on_disk.accepted + now.accepted - then.accepted),
        max(0.0, on_disk.rejected + now.rejected - then.rejected),
    )


def learned_json(acceptance: AcceptanceRecord, answers: list[AnswerLength]) -> dict[str, Any]:
    """A learned file's content: acceptance counts and answer lengths, oldest first."""
    return {
        "acceptance": acceptance.to_dict(),
        "answers": [[answer.num_tokens, answer.cut_by_budget] for answer in answers],
    }


def read_learned(path: Path) -> tuple[AcceptanceRecord, list[AnswerLength]] | None:
    """The acceptance counts and answers in the learned file at ``path``; None if it is missing or does not parse."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        acceptance = AcceptanceRecord.from_dict(saved["acceptance"])
        answers = [AnswerLength(int(num_tokens), cut) for num_tokens, cut in saved["answers"]]
    except (OSError, ValueError, OverflowError, KeyError, TypeError):
        return None
    if not all(answer.num_tokens >= 0 and isinstance(answer.cut_by_budget, bool) for answer in answers):
        return None
    return acceptance, answers

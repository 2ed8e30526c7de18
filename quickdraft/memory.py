"""What one drafter learns and measures across requests, and where it is kept between processes.

A :class:`DrafterMemory` bundles a drafter's acceptance record, answer lengths, step times, cost
model and acceptance head: the pipeline holds one per drafter, the engine takes it, and a policy sees
it through a :class:`PolicyContext`. Its learned part (acceptance and answer lengths) is saved to a
*learned file* so a process that serves one request (the CLI) begins where earlier ones left off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quickdraft.acceptance_head import AcceptanceHead
from quickdraft.config import GenerationConfig
from quickdraft.costs import CostModel
from quickdraft.models.catalog import cache_root
from quickdraft.policies import AcceptanceRecord, AnswerLength, AnswerLengthRecord, PolicyContext, StepTimeRecord


@dataclass
class DrafterMemory:
    """One drafter's state shared by its requests: what it learned of answers, what steps cost."""

    acceptance: AcceptanceRecord = field(default_factory=AcceptanceRecord)  # first and later drafts accepted
    answer_lengths: AnswerLengthRecord = field(default_factory=AnswerLengthRecord)  # how long answers ran
    step_times: StepTimeRecord = field(default_factory=StepTimeRecord)  # what the engine's steps took
    cost_model: CostModel | None = None  # measured forward costs (goodput)
    acceptance_head: AcceptanceHead | None = None  # a trained SpecDec++ head

    def policy_context(self, config: GenerationConfig) -> PolicyContext:
        """What a request's policy may use: its γ settings and this memory."""
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
        """Drop what was learned of earlier answers (acceptance, lengths); what steps cost stays measured."""
        self.acceptance = AcceptanceRecord()
        self.answer_lengths = AnswerLengthRecord()

    def learned(self) -> dict[str, Any]:
        """The learned part as JSON-ready data."""
        return {
            "acceptance": self.acceptance.to_dict(),
            "answers": [[answer.num_tokens, answer.cut_by_budget] for answer in self.answer_lengths.answers],
        }

    def load_learned(self, path: Path) -> int:
        """Start from the learned file at ``path``; how many answers it held (0: none yet, or a file that does
        not parse, which the next save replaces)."""
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            acceptance = AcceptanceRecord.from_dict(saved["acceptance"])
            answers = [AnswerLength(int(num_tokens), cut) for num_tokens, cut in saved["answers"]]
        except (OSError, ValueError, OverflowError, KeyError, TypeError):
            return 0
        if not all(answer.num_tokens >= 0 and isinstance(answer.cut_by_budget, bool) for answer in answers):
            return 0
        self.acceptance = acceptance
        self.answer_lengths = AnswerLengthRecord(deque(answers))
        return len(self.answer_lengths.answers)

    def save_learned(self, path: Path) -> None:
        """Write the learned part to ``path`` (a file that cannot be written only means the next process
        starts knowing less)."""
        with contextlib.suppress(OSError):
            write_atomically(path, json.dumps(self.learned()))


def calibrations_dir() -> Path:
    """Where measured cost models and learned files are saved: ``$QUICKDRAFT_CACHE/calibrations``."""
    return cache_root() / "calibrations"


def keyed_file(key: Mapping[str, Any], suffix: str) -> Path:
    """A file in :func:`calibrations_dir` named by the hash of everything its content depends on."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return calibrations_dir() / f"{digest}{suffix}"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, so a reader (or a process stopped
    mid-write) sees the old file or the new one, never a cut one; raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise

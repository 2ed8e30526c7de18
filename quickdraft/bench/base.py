"""What every benchmark method is: one turn in (greedy, or sampled where the method can), a :class:`TurnResult`
out (:mod:`quickdraft.bench.methods` registers them by name)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from quickdraft.api import Pipeline
from quickdraft.bench.metrics import MethodInfo
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import MAX_SEED, SamplingParams

GREEDY = SamplingParams()


def run_sampling(temperature: float, seed: int | None) -> SamplingParams:
    """How a benchmark run's tokens are chosen: greedy at temperature 0, else sampled, seeded when ``seed`` is
    given (which needs a temperature: a greedy run has nothing to seed)."""
    if seed is not None and temperature == 0:
        raise ConfigError("--seed seeds sampling: give a --temperature above 0 with it")
    return SamplingParams(temperature, seed=seed)


def run_seed(seed: int, run: int) -> int:
    """The seed run ``run`` (0-based) of a seeded benchmark samples with: ``seed`` + ``run``, modulo 2⁶⁴."""
    return (seed + run) % (MAX_SEED + 1)


@dataclass(frozen=True)
class TurnResult:
    token_ids: list[int]  # new tokens, an end-of-sequence token included
    wall_time_s: float  # the whole call, prefill included
    step_sizes: list[int]  # tokens appended per target step (the prefill's first token is a step)
    step_times_s: list[float]  # seconds from the call's start to each step's tokens
    draft_tokens_proposed: int | None = None  # None: the method does not report it
    draft_tokens_accepted: int | None = None
    gammas: list[int] = field(default_factory=list)  # γ chosen at each verify step (our speculative methods)


class Method(ABC):
    name: str
    num_draft_tokens: int | None = None  # γ, for the theory check; None: not a fixed-γ method of ours
    max_draft_tokens: int = 0  # the largest γ it may use: the cost curves are measured up to it + 1
    uses_draft_model: bool = False
    uses_draft_head: bool = False  # it drafts with a trained draft head (--draft-head)
    target_cost_fraction: float | None = None  # self-speculation: a draft token's share of a target step
    runtime: str | None = None  # another runtime than the bench's (spec suffix @RUNTIME)
    baseline: str = "baseline"  # the method its speedup and lossless fraction are measured against
    peer: bool = False  # another implementation with its own arithmetic: its tokens' agreement, not losslessness
    samples: bool = False  # it can decode at a temperature (else the bench refuses a sampled run with it)

    def info(self) -> MethodInfo:
        """What the aggregation needs to know of this method."""
        return MethodInfo(
            self.num_draft_tokens, self.uses_draft_model, self.target_cost_fraction, self.baseline, self.peer
        )

    def check(self) -> None:  # noqa: B027
        """Before any model is loaded: fail with a clear error if this method cannot run here."""

    def load(self, pipeline: Pipeline, cost_curves: Mapping[str, Mapping[int, float]], context: int = 0) -> None:  # noqa: B027
        """Before measuring: build what the method runs (a drafter, a peer's model) and take the bench's cost curves
        (ms per forward of k tokens after ``context`` cached tokens, by
        :class:`quickdraft.costs.calibration.CurveRole`)."""

    def start_conversation(self, pipeline: Pipeline, keep: Sequence[int] = ()) -> None:  # noqa: B027
        """Before a question's first turn: nothing carried over from another question or method but the
        start ``keep`` that every request shares (the chat template's system prompt)."""

    @abstractmethod
    def run(
        self, pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY
    ) -> TurnResult:
        """Generate after ``prompt_ids`` (greedily, or with ``sampling`` if the method :attr:`samples`); time the
        whole call."""

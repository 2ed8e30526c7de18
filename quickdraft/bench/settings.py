"""What one ``quickdraft bench`` run is asked to do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quickdraft.bench.base import run_sampling, run_seed
from quickdraft.bench.long_context import check_lengths
from quickdraft.bench.names import DEFAULT_METHODS
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import SamplingParams
from quickdraft.models.catalog import DEFAULT_TARGET
from quickdraft.runtime import AUTO, check_runtime
from quickdraft.runtime.device import resolve_device


@dataclass(frozen=True)
class BenchSettings:
    """One ``quickdraft bench`` invocation (validated before any model is loaded)."""

    out: Path = Path("bench-results")
    questions: Path | None = None  # None: ../shared/data/spec_bench/question.jsonl when it exists
    context_lengths: tuple[int, ...] = ()  # instead of a question file: long-context questions of these lengths
    per_category: int | None = 5  # None: every question
    categories: tuple[str, ...] = ()  # of the sample, keep these categories only (empty: all)
    max_new_tokens: int = 128
    methods: str = DEFAULT_METHODS
    runs: int = 1
    warmup: int = 1
    seed: int = 0  # of the per-category question sample
    temperature: float = 0.0  # 0: greedy
    sampling_seed: int | None = None  # seeded sampling: our methods' text equals plain decoding's
    profile_context: int = 512
    target: str = DEFAULT_TARGET
    draft: str | None = None  # None: the default draft model, if a method uses one
    draft_weights: str | None = None  # None: quickdraft.runtime.options.DRAFT_WEIGHTS (native runtime)
    draft_vocabulary: int | None = None  # None: quickdraft.runtime.options.DRAFT_VOCABULARY (native runtime)
    draft_head: str | None = None  # the eagle drafters' head (None: the target's default)
    kv_cache_dtype: str | None = None  # what the native KV caches hold (None: KV_CACHE_DEFAULT)
    max_context: int | None = None  # the most positions a request holds (None: the target's declared context)
    runtime: str = AUTO
    device: str = AUTO  # where our models run (runtime/device.py); peers run where they run
    report_only: bool = False

    def __post_init__(self) -> None:
        GenerationConfig(max_new_tokens=self.max_new_tokens)  # the same check as a request's
        for flag, value, least in (("--runs", self.runs, 1), ("--warmup", self.warmup, 0),
                                   ("--profile-context", self.profile_context, 1)):  # fmt: skip
            if value < least:
                raise ConfigError(f"{flag} must be >= {least}, got {value}")
        if self.per_category is not None and self.per_category < 1:
            raise ConfigError(f"--per-category must be >= 1, got {self.per_category}")
        if self.context_lengths and self.questions is not None:
            raise ConfigError("--context-lengths and --questions are two question sets: choose one")
        if self.context_lengths and self.categories:
            raise ConfigError("--categories picks from a question file's categories, not from --context-lengths")
        if self.context_lengths:  # before any model is resolved or loaded
            check_lengths(self.context_lengths, self.max_new_tokens)
        self.sampling  # noqa: B018 - validates the temperature and seed
        check_runtime(self.runtime)
        resolve_device(self.device)  # a GPU that is not there fails before anything is written

    @property
    def sampling(self) -> SamplingParams:
        return run_sampling(self.temperature, self.sampling_seed)

    def sampling_of_run(self, run: int) -> SamplingParams:
        """How run ``run`` (0-based) chooses tokens: seeded runs sample with seed S + run (modulo 2⁶⁴), so each run
        is another sample of every question, its text checked against plain decoding's in the same run; greedy and
        unseeded runs as :attr:`sampling`."""
        if self.sampling_seed is None:
            return self.sampling
        return run_sampling(self.temperature, run_seed(self.sampling_seed, run))

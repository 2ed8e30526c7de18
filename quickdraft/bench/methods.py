"""Benchmark methods by name: our decoding with each drafter, and transformers' peers.

A method spec is ``NAME``, ``NAME:γ`` or ``NAME+POLICY``: ``baseline`` (our plain decoding),
``control`` (plain decoding again as a method of its own: an A/A control of the bench's noise), any
drafter at a fixed γ (``draft-model:2``, ``prompt-lookup``; γ defaults to 4) or with an adaptive
policy (``draft-model+goodput``, ``prompt-lookup+confidence:0.4``), and the peers ``hf-generate``,
``hf-assisted``, ``hf-assisted-tuned`` and ``hf-prompt-lookup`` (transformers ``generate``
on the same weights), ``llama-cpp``, ``llama-cpp-prompt-lookup`` and ``llama-cpp-draft``
(llama.cpp on the GGUF files the models were converted from, :mod:`quickdraft.bench.llama_cpp`) and
``openvino`` and ``openvino-draft`` (OpenVINO GenAI on int4 exports of the same weights,
:mod:`quickdraft.bench.openvino`): measured, never quoted. Every method runs one turn, greedily or, if it
:attr:`~Method.samples`, at the bench's temperature, and reports a :class:`TurnResult`.

Our methods take ``@RUNTIME`` to run on another runtime than the bench's (``draft-model:2@transformers``):
their speedup is over ``baseline@RUNTIME``, whose own speedup is over the bench's ``baseline``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from quickdraft.api import Pipeline
from quickdraft.bench.base import GREEDY, Method, TurnResult
from quickdraft.bench.llama_cpp import LlamaCppDraftMethod, LlamaCppMethod
from quickdraft.bench.openvino import OpenVinoMethod
from quickdraft.bench.peers import PEER_SETTINGS, StepClock, hf_generate
from quickdraft.config import DEFAULT_NUM_DRAFT_TOKENS, GenerationConfig
from quickdraft.costs.calibration import CurveRole, cost_model_from_curves
from quickdraft.drafters import DRAFTERS
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import SamplingParams
from quickdraft.registry import Registry
from quickdraft.runtime import RUNTIMES


class EngineMethod(Method):
    """Our engine with one drafter at a fixed γ or with a policy (``none`` with γ = 0 is the baseline)."""

    samples = True

    def __init__(
        self, name: str, drafter: str, num_draft_tokens: int, policy: str = "fixed", runtime: str | None = None
    ) -> None:
        self.name = name if runtime is None else f"{name}@{runtime}"
        self.drafter = drafter
        self.policy = GenerationConfig(policy=policy).policy_spec  # parsed once: a bad one fails here
        self.runtime = runtime
        if runtime is not None and drafter != "none":
            self.baseline = f"baseline@{runtime}"
        # γ for the theory check: fixed-γ speculation on the bench's own runtime, whose cost curves it measured
        fixed = self.policy.name == "fixed"
        checked = drafter != "none" and fixed and runtime is None
        self.num_draft_tokens = num_draft_tokens if checked else None
        self.max_draft_tokens = num_draft_tokens if fixed else GenerationConfig().max_draft_tokens
        self.uses_draft_model = DRAFTERS.get(drafter).needs_draft_model
        self.uses_draft_head = DRAFTERS.get(drafter).needs_draft_head
        self.target_cost_fraction = DRAFTERS.get(drafter).target_cost_fraction
        self._gamma = num_draft_tokens

    def load(self, pipeline: Pipeline, cost_curves: Mapping[str, Mapping[int, float]], context: int = 0) -> None:
        """Build the drafter now (one that cannot run on this runtime fails before anything is timed).
        Adaptive policies plan with the curves the bench measured (no separate calibration), or, on
        another runtime, with goodput's start-up calibration of that runtime."""
        drafter = pipeline.drafter(self.drafter)
        if self.runtime is None and self.drafter != "none" and CurveRole.TARGET in cost_curves:
            drafter.records.cost_model = cost_model_from_curves(cost_curves, type(drafter), context)
        pipeline.setup_policy(self.drafter, self.config(GenerationConfig().max_new_tokens))

    def config(self, max_new_tokens: int) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=max_new_tokens, num_draft_tokens=self._gamma, policy=self.policy)

    def start_conversation(self, pipeline: Pipeline, keep: Sequence[int] = ()) -> None:
        """Methods share a drafter: without this one could reuse the prompt another just read. A serving
        draft model keeps what every request starts with; so does this one, for every method alike."""
        pipeline.drafter(self.drafter).forget(keep)

    def run(
        self, pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY
    ) -> TurnResult:
        config = replace(self.config(max_new_tokens), sampling=sampling)
        started = time.perf_counter()
        result = pipeline.generate(prompt_ids, config, drafter=self.drafter)
        wall_time_s = time.perf_counter() - started
        stats = result.stats
        speculative = self.drafter != "none"
        return TurnResult(
            token_ids=result.token_ids,
            wall_time_s=wall_time_s,
            step_sizes=list(stats.step_sizes),
            step_times_s=list(stats.step_times_s),
            draft_tokens_proposed=stats.draft_tokens_proposed if speculative else None,
            draft_tokens_accepted=stats.draft_tokens_accepted if speculative else None,
            gammas=list(stats.gamma_per_step) if speculative else [],
        )


class PeerMethod(Method):
    """transformers ``generate`` with the peer's settings on the pipeline's weights."""

    peer = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.settings = dict(PEER_SETTINGS[name])
        self.uses_draft_model = bool(self.settings.pop("assistant", False))

    def run(
        self, pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY
    ) -> TurnResult:
        model = pipeline.transformers_model("target")
        assistant = pipeline.transformers_model("draft") if self.uses_draft_model else None
        clock = StepClock()
        token_ids = hf_generate(
            model,
            prompt_ids,
            max_new_tokens,
            pipeline.eos_token_ids,
            pipeline.tokenizer.pad_token_id,
            assistant_model=assistant,
            streamer=clock,
            **self.settings,
        )
        clock.stop()
        return clock.turn_result(token_ids)


MethodFactory = Callable[[str, "int | None", "str | None"], Method]  # (spec, γ, @runtime) -> method
METHODS: Registry[MethodFactory] = Registry("benchmark method")


def _baseline(spec: str, num_draft_tokens: int | None, runtime: str | None) -> Method:
    if num_draft_tokens is not None:
        raise ConfigError(f"method {spec!r}: baseline takes no number of draft tokens")
    return EngineMethod("baseline", "none", 0, runtime=runtime)


def _control(spec: str, num_draft_tokens: int | None, runtime: str | None) -> Method:
    """Plain decoding again, timed as a method of its own: an A/A control whose speedup over the
    baseline is the bench's own noise (it runs the very same tokens and code)."""
    if num_draft_tokens is not None or runtime is not None:
        raise ConfigError(f"method {spec!r}: control takes no number of draft tokens and no runtime")
    return EngineMethod("control", "none", 0)


def _peer_method(peer: str, build: Callable[[], Method]) -> MethodFactory:
    """A peer's factory: peers take no γ and run on their own arithmetic, never on one of our runtimes."""

    def make(spec: str, num_draft_tokens: int | None, runtime: str | None) -> Method:
        if num_draft_tokens is not None:
            raise ConfigError(f"method {spec!r}: {peer} takes no number of draft tokens")
        if runtime is not None:
            raise ConfigError(f"method {peer!r} cannot take @{runtime}: only our methods run on a chosen runtime")
        return build()

    return make


def _drafter_method(drafter: str) -> MethodFactory:
    def make(spec: str, num_draft_tokens: int | None, runtime: str | None) -> Method:
        gamma = DEFAULT_NUM_DRAFT_TOKENS if num_draft_tokens is None else num_draft_tokens
        if gamma < 1:
            raise ConfigError(f"method {spec!r}: the number of draft tokens must be >= 1")
        return EngineMethod(f"{drafter}:{gamma}", drafter, gamma, runtime=runtime)

    return make


METHODS.register("baseline")(_baseline)
METHODS.register("control")(_control)
for _drafter in DRAFTERS.names():
    if _drafter != "none":
        METHODS.register(_drafter)(_drafter_method(_drafter))
PEERS: dict[str, Callable[[], Method]] = {  # the builders of bench/names.py's PEER_NAMES
    **{name: partial(PeerMethod, name) for name in PEER_SETTINGS},
    "llama-cpp": partial(LlamaCppMethod, "llama-cpp"),
    "llama-cpp-prompt-lookup": partial(LlamaCppMethod, "llama-cpp-prompt-lookup", prompt_lookup=True),
    "llama-cpp-draft": partial(LlamaCppDraftMethod, "llama-cpp-draft"),
    "openvino": partial(OpenVinoMethod, "openvino"),
    "openvino-draft": partial(OpenVinoMethod, "openvino-draft", draft=True),
}
for _peer, _build in PEERS.items():
    METHODS.register(_peer)(_peer_method(_peer, _build))


def make_method(spec: str) -> Method:
    """``NAME``, ``NAME:γ`` or ``DRAFTER+POLICY``, each optionally ``@RUNTIME`` -> a method; fixed-γ
    drafters are named with their γ."""
    text, at, on_runtime = spec.strip().partition("@")
    if at and on_runtime not in RUNTIMES.names():
        raise ConfigError(f"method {spec!r}: unknown runtime {on_runtime!r} (known: {', '.join(RUNTIMES.names())})")
    runtime = on_runtime if at else None
    drafter, plus, policy = text.strip().partition("+")
    if plus:
        if drafter in ("baseline", "none") or drafter not in DRAFTERS.names():
            raise ConfigError(f"method {text!r}: a policy needs a drafter ({', '.join(DRAFTERS.names())})")
        return EngineMethod(f"{drafter}+{policy}", drafter, DEFAULT_NUM_DRAFT_TOKENS, policy, runtime)
    name, _, gamma_text = text.strip().partition(":")
    gamma = None
    if gamma_text:
        try:
            gamma = int(gamma_text)
        except ValueError:
            raise ConfigError(f"method {text!r}: expected NAME or NAME:γ with an integer γ") from None
    return METHODS.get(name)(text, gamma, runtime)


def parse_methods(text: str) -> list[Method]:
    """Comma-separated specs; ``baseline`` is always measured first (speedups are relative to it), and
    ``baseline@RUNTIME`` is added for methods on another runtime."""
    methods = [make_method(spec) for spec in text.split(",") if spec.strip()]
    if not methods:
        raise ConfigError(f"--methods: no methods given, got {text!r}; name at least one (e.g. baseline)")
    names = [method.name for method in methods]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"--methods names {', '.join(duplicates)} more than once")
    baselines = dict.fromkeys(["baseline", *(method.baseline for method in methods)])
    methods[:0] = [make_method(baseline) for baseline in baselines if baseline not in names]
    return sorted(methods, key=lambda method: method.name != "baseline")

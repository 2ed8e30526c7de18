"""Structured output under speculation: the target masked by the grammar at every verified position, so the output
is constrained plain decoding's, whatever drafts the drafter proposed."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import native_pipeline

from quickdraft import grammar
from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.engine import Event, FailureCause, Request, RequestFailed, RequestFinished
from quickdraft.errors import ConfigError
from quickdraft.grammar import GrammarCompiler, GrammarKind, GrammarSpec, xgrammar_reason

EOS = 47
REGEXES = ["(w1|w2|w3)+", "w5w9(w1|w2){2,6}", "(w4|w5)(w6|w7)+w8"]  # no token leads to a dead end
DRAFTERS = [("none", None), ("draft-model", "fixed:3"), ("hybrid", "goodput"), ("prompt-lookup", "fixed:5")]


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return dataclasses.replace(native_pipeline(), eos_token_ids=frozenset({EOS}))


def text(native: Pipeline, token_ids: list[int]) -> str:
    return "".join(native.tokenizer.convert_ids_to_tokens([t for t in token_ids if t != EOS]))


@pytest.mark.parametrize("regex", REGEXES)
@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=7)], ids=["greedy", "seeded"]
)
def test_every_drafter_gives_constrained_plain_decodings_output(
    native: Pipeline, regex: str, sampling: SamplingParams
) -> None:
    grammar = GrammarSpec(GrammarKind.REGEX, regex)
    outputs = {}
    for drafter, policy in DRAFTERS:
        config = GenerationConfig(max_new_tokens=16, sampling=sampling, grammar=grammar, policy=policy)
        outputs[drafter] = native.generate([3, 1, 4, 1, 5, 9, 2, 6], config, drafter=drafter).token_ids
    plain = outputs["none"]
    assert all(tokens == plain for tokens in outputs.values()), outputs
    if plain[-1] == EOS:  # the grammar was completed: the whole output matches it
        assert re.fullmatch(regex, text(native, plain))


def test_the_masks_follow_the_drafts_the_grammar_allows_and_leave_the_place(native: Pipeline) -> None:
    compiler = GrammarCompiler(native.tokenizer, native.target.vocab_size, native.eos_token_ids)
    constraint = compiler.constraint(GrammarSpec(GrammarKind.REGEX, "w5w9(w1|w2)+"))
    allowed, valid = constraint.masks([5, 9, 1, 7, 1])  # w7 breaks it
    assert valid == 3 and allowed.shape == (4, native.target.vocab_size)
    assert allowed[0].nonzero().flatten().tolist() == [5] and allowed[1].nonzero().flatten().tolist() == [9]
    assert set(allowed[3].nonzero().flatten().tolist()) == {1, 2, EOS}  # after w5 w9 w1: more, or the end
    again, _ = constraint.masks([5, 9, 1, 7, 1])
    assert (again == allowed).all()  # the place did not move
    constraint.accept([5, 9])
    assert constraint.masks([1])[0][0].nonzero().flatten().tolist() == [1, 2]


def test_bad_grammars_are_clear_errors(native: Pipeline) -> None:
    with pytest.raises(ConfigError, match="valid JSON"):
        GrammarSpec(GrammarKind.JSON_SCHEMA, "{not json")
    with pytest.raises(ConfigError, match="needs its text"):
        GrammarSpec(GrammarKind.REGEX, "")
    with pytest.raises(ConfigError, match="does not compile"):
        native.generate([1, 2], GenerationConfig(4, grammar=GrammarSpec(GrammarKind.REGEX, "(w1")), drafter="none")
    with pytest.raises(ConfigError, match="end-of-sequence") as refused:
        GrammarCompiler(native.tokenizer, native.target.vocab_size, frozenset()).compile(GrammarSpec(GrammarKind.JSON))
    assert refused.value.setting == "json_object"
    with pytest.raises(ConfigError, match="takes no text"):
        GrammarSpec(GrammarKind.JSON, "garbage")
    with pytest.raises(ConfigError, match="can begin"):  # the word tokenizer cannot write "zzz": a clear error
        native.generate([1, 2], GenerationConfig(4, grammar=GrammarSpec(GrammarKind.REGEX, "zzz")), drafter="none")
    assert native.generate([1, 2], GenerationConfig(2), drafter="none").token_ids  # and the engine goes on


def test_a_dead_end_mid_answer_ends_that_request_alone(native: Pipeline) -> None:
    """ "w1zzz": w1 can begin it, but no token spells the rest. That request fails as its own fault; the one beside
    it in the same steps gets its text alone."""
    dead_end = GenerationConfig(6, grammar=GrammarSpec(GrammarKind.REGEX, "w1zzz"))
    other = GenerationConfig(6, policy="fixed:3")
    alone = native.generate([3, 4, 5], other, drafter="draft-model").token_ids
    events: dict[str, list[Event]] = {"dead end": [], "other": []}
    for name, prompt, config in (("dead end", [1, 2], dead_end), ("other", [3, 4, 5], other)):
        request = Request(tuple(prompt), config, native.drafter("draft-model"), request_id=name)
        native.engine.submit(request, events[name].append)
    native.engine.run_until_idle()
    failed = events["dead end"][-1]
    assert isinstance(failed, RequestFailed) and failed.cause is FailureCause.REQUEST
    assert "allows no token" in failed.message
    finished = events["other"][-1]
    assert isinstance(finished, RequestFinished) and finished.result.token_ids == alone
    with pytest.raises(ConfigError, match="allows no token of this model's vocabulary after the answer so far"):
        native.generate([1, 2], dead_end, drafter="none")
    assert native.engine.idle and native.generate([3, 4, 5], other, drafter="draft-model").token_ids == alone


def test_a_json_object_constraint_takes_objects_only(native: Pipeline) -> None:
    import xgrammar

    compiled = GrammarCompiler(native.tokenizer, native.target.vocab_size, [EOS]).compile(GrammarSpec(GrammarKind.JSON))
    for text, accepted in (('{"a": [1, {"b": null}]}', True), ("{ }", True), ("[1, 2]", False), ('"w1"', False)):
        assert xgrammar.GrammarMatcher(compiled).accept_string(text) == accepted, text


@pytest.mark.parametrize("kind", [GrammarKind.JSON, GrammarKind.JSON_SCHEMA])
def test_json_whitespace_runs_are_bounded(native: Pipeline, kind: GrammarKind) -> None:
    """Pretty-printed JSON is allowed; an answer padded with whitespace between tokens is not (a weak model would
    pad it until max_tokens)."""
    import xgrammar

    spec = GrammarSpec(kind, '{"type": "object"}' if kind is GrammarKind.JSON_SCHEMA else "")
    compiled = GrammarCompiler(native.tokenizer, native.target.vocab_size, [EOS]).compile(spec)
    indented = "{\n" + " " * 20 + '"a": {\n  "b": [1,\n    2]\n  }\n}'
    padded = "{" + " " * (grammar.JSON_WHITESPACE_RUN + 1) + "}"
    assert xgrammar.GrammarMatcher(compiled).accept_string(indented)
    assert not xgrammar.GrammarMatcher(compiled).accept_string(padded)


def test_compiled_grammars_are_kept_within_a_bound(native: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every distinct schema a client sends is compiled and kept: without a bound, a server's memory grows."""
    monkeypatch.setattr(grammar, "GRAMMAR_CACHE_BYTES", 200_000)
    compiler = GrammarCompiler(native.tokenizer, native.target.vocab_size, [EOS])
    for length in range(1, 200):
        compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, f'{{"type": "string", "minLength": {length}}}'))
    assert compiler._compiler.get_cache_size_bytes() < 2 * 200_000


def test_xgrammars_log_prefix_is_left_out_of_messages() -> None:
    error = RuntimeError('[04:00:10] /project/cpp/json_schema_converter.cc:83: Unsupported type "x"\nstack')
    assert xgrammar_reason(error) == 'Unsupported type "x"'


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(), SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=1.0)],
    ids=["greedy", "seeded", "unseeded"],
)
def test_a_draft_model_drafts_only_what_the_grammar_allows(native: Pipeline, sampling: SamplingParams) -> None:
    """Its distribution is masked at each draft position: every draft is allowed, the recorded distributions put no
    mass elsewhere, and the grammar's place is where the committed answer left it."""
    import torch
    from conftest import draft_task

    from quickdraft.drafters.draft_model import DraftModelDrafter

    compiler = GrammarCompiler(native.tokenizer, native.target.vocab_size, native.eos_token_ids)
    constraint = compiler.constraint(GrammarSpec(GrammarKind.REGEX, "w5w9(w1|w2)+"))
    constraint.accept([5])
    drafter = DraftModelDrafter(native.draft, native.target.vocab_size)  # type: ignore[arg-type]
    context = [3, 1, 4, 1, 5]
    state = drafter.start(context, target_cache=None)  # type: ignore[arg-type]
    task = dataclasses.replace(
        draft_task(state, context, 6, sampling, torch.Generator().manual_seed(0)), grammar=constraint.cursor()
    )
    (proposal,) = drafter.propose([task])
    drafts = proposal.token_ids[0].tolist()
    allowed, valid = constraint.masks(drafts)  # from the committed place: the drafts did not move it
    assert drafts[0] == 9 and valid == len(drafts) >= 2, drafts  # up to 6, or its end-of-sequence
    if not sampling.is_unseeded:  # greedy and seeded verification never read q: none is kept
        assert proposal.probs is None
        return
    assert proposal.probs is not None
    for i, token in enumerate(drafts):
        assert proposal.probs[0, i, ~allowed[i]].sum() == 0 and proposal.probs[0, i, token] > 0
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(1, len(drafts)))


def test_a_drafters_cursor_follows_its_drafts_and_leaves_the_committed_place(native: Pipeline) -> None:
    compiler = GrammarCompiler(native.tokenizer, native.target.vocab_size, native.eos_token_ids)
    constraint = compiler.constraint(GrammarSpec(GrammarKind.REGEX, "w5w9"))
    cursor = constraint.cursor()
    mask = cursor.draft_mask()
    assert mask is not None and mask.nonzero().flatten().tolist() == [5]
    cursor.take_draft(5)
    assert cursor.draft_mask().nonzero().flatten().tolist() == [9]  # type: ignore[union-attr]
    cursor.take_draft(9)
    cursor.take_draft(EOS)
    assert cursor.draft_mask() is None  # complete: nothing after the end
    with pytest.raises(RuntimeError, match="against the grammar"):
        cursor.take_draft(5)
    again = constraint.cursor()  # the committed place never moved
    assert again.draft_mask().nonzero().flatten().tolist() == [5]  # type: ignore[union-attr]
    assert constraint.masks([5, 9])[1] == 2 and not constraint.finished

"""Structured output: a request's tokens constrained to a grammar (JSON, a JSON schema, a regex or an EBNF
grammar) with xgrammar, the engine whose per-token mask cost measured lowest on our CPUs
(``tools/grammar_mask_cost.py``).

Under speculation the rule is plain constrained decoding's: at every position the target's distribution is masked
to the tokens the grammar allows after the tokens before it, then verified as usual. :meth:`Constraint.masks` walks
a step's drafts through the grammar, giving one mask per verified position and how many drafts the grammar allows
at all (the others cannot be accepted and are not verified), then returns to where the answer stands. A draft model
drafts from its distribution masked the same way (:meth:`Constraint.draft_mask`), so its drafts are allowed and
verification's ratios use what it drew from; copies are cut at the first token the grammar forbids. So greedy
output is constrained plain decoding's token for token, and sampled output has its distribution.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quickdraft.errors import ConfigError
from quickdraft.grammar_schema import check_enforced, compiled_schema

ANY_OBJECT = '{"type": "object"}'  # a json_object answer: any JSON object
GRAMMAR_CACHE_BYTES = 256 << 20  # the compiler keeps at most this much of compiled grammars (xgrammar: no bound)
# JSON may put at most this many whitespace characters in a row between its tokens: room for a newline and the
# indentation of pretty-printed JSON ten levels deep, never an answer padded with whitespace until max_tokens
JSON_WHITESPACE_RUN = 24


class GrammarDeadEnd(ConfigError):
    """The answer so far leaves the grammar no token of the vocabulary (a tokenizer that cannot spell what it needs
    next): that request cannot go on, the others can."""


class GrammarKind(enum.Enum):
    JSON = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # text: the schema as JSON
    REGEX = "regex"
    EBNF = "grammar"  # xgrammar's EBNF (GBNF-like), root rule ``root``


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    text: str = ""
    opens_free: bool = False  # any text may open the answer: the grammar constrains it only from a trigger on (lazy)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, GrammarKind) or not isinstance(self.text, str):
            raise ConfigError("a grammar is a GrammarKind and its text")
        if self.kind is GrammarKind.JSON_SCHEMA:
            try:
                schema = json.loads(self.text)
            except ValueError:
                raise ConfigError("a JSON schema must be valid JSON", self.kind.value) from None
            if (error := schema_error(schema)) is not None:
                raise ConfigError(f"the JSON schema is not a valid JSON schema: {error}", self.kind.value)
            check_enforced(schema, self.kind.value)
        elif self.kind is not GrammarKind.JSON and not self.text:
            raise ConfigError(f"a {self.kind.value} constraint needs its text", self.kind.value)
        elif self.kind is GrammarKind.JSON and self.text:
            raise ConfigError(
                "a json_object constraint takes no text: a schema goes with GrammarKind.JSON_SCHEMA", self.kind.value
            )


def schema_error(schema: Any) -> str | None:
    """Why ``schema`` is no JSON schema, checked against the meta-schema its ``$schema`` names (2020-12 without one),
    as OpenAI checks a schema; None for a valid one."""
    from jsonschema import Draft202012Validator, SchemaError, validators

    if not isinstance(schema, dict | bool):
        return f"a schema is an object or a boolean, got {type(schema).__name__}"
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):  # jsonschema fails on it unsaid
        return "its $schema must be a URI"
    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as error:
        return error.message
    return None


class GrammarCompiler:
    """Compiles grammars for one tokenizer (vocabulary of the model's ``vocab_size`` logits, ``stop_token_ids``
    ending an answer the grammar has completed), keeping what it compiled."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        try:
            import xgrammar
        except ImportError:
            raise ConfigError("structured output needs xgrammar: pip install 'quickdraft[serve]'") from None
        self._xgr = xgrammar
        self.vocab_size = vocab_size
        self._compiler = None  # without end tokens every grammar is refused (:meth:`compile`), each on its field
        if stop_token_ids:
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
            )
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_limit_bytes=GRAMMAR_CACHE_BYTES)

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar; a grammar xgrammar cannot compile raises ``ConfigError`` saying why, its setting the
        constraint's kind."""
        if self._compiler is None:
            raise ConfigError(
                "structured output needs end-of-sequence tokens: they end a completed answer", spec.kind.value
            )
        grammar = grammar_of(spec)
        try:
            return self._compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError) as error:
            message = f"the {spec.kind.value} constraint does not compile: {xgrammar_reason(error)}"
            raise ConfigError(message, spec.kind.value) from None

    def constraint(self, spec: GrammarSpec) -> Constraint:
        """A new request's place at the grammar's start; ``ConfigError`` if no token of the vocabulary can begin it."""
        constraint = Constraint(self._xgr, self.compile(spec), self.vocab_size)
        if not bool(constraint.masks([])[0].any()):
            raise ConfigError(
                f"no token of this model's vocabulary can begin the {spec.kind.value} constraint", spec.kind.value
            )
        return constraint


class Constraint:
    """One request's place in its grammar: after its committed answer tokens. The engine's alone: a drafter
    drafts with a :meth:`cursor` of its own."""

    def __init__(self, xgr: Any, compiled: Any, vocab_size: int) -> None:
        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size

    def cursor(self) -> DraftCursor:
        """A place of the drafter's own, at the committed place now; its drafts never move this one."""
        return DraftCursor(self._xgr, self._matcher.fork(), self.vocab_size)

    def masks(self, drafts: Sequence[int]) -> tuple[torch.Tensor, int]:
        """``(allowed [n + 1, V] bool, n)``: n is how many of ``drafts`` the grammar accepts in a row from here, and
        row i the tokens it allows after the first i of them. The place is unchanged afterwards."""
        bitmask = self._xgr.allocate_token_bitmask(len(drafts) + 1, self.vocab_size)  # [n + 1, ⌈V/32⌉] int32
        accepted = 0
        for i, token in enumerate([*drafts, None]):
            if self._matcher.is_terminated():  # an end-of-sequence draft: nothing after it is ever committed
                bitmask[i] = -1
                break
            self._matcher.fill_next_token_bitmask(bitmask, i)
            if token is None or not self._matcher.accept_token(int(token)):
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return allowed_tokens(self._xgr, bitmask[: accepted + 1], self.vocab_size), accepted

    def accept(self, tokens: Sequence[int]) -> None:
        """Move past the tokens committed (each allowed by the masks they were chosen under)."""
        for token in tokens:
            if not self._matcher.accept_token(int(token)):
                raise RuntimeError(f"token {token} was committed against the grammar")

    @property
    def finished(self) -> bool:
        return bool(self._matcher.is_terminated())


class DraftCursor:
    """A drafter's place in a request's grammar for one step's drafts: from the committed place, moved by each draft
    it takes, dropped after drafting."""

    def __init__(self, xgr: Any, matcher: Any, vocab_size: int) -> None:
        self._xgr, self._matcher, self.vocab_size = xgr, matcher, vocab_size

    def draft_mask(self) -> torch.Tensor | None:
        """``allowed [V] bool`` after the drafts taken so far; None once the grammar is complete (nothing after its
        end is ever committed)."""
        if self._matcher.is_terminated():
            return None
        bitmask = self._xgr.allocate_token_bitmask(1, self.vocab_size)  # [1, ⌈V/32⌉] int32
        self._matcher.fill_next_token_bitmask(bitmask, 0)
        return allowed_tokens(self._xgr, bitmask, self.vocab_size)[0]

    def take_draft(self, token: int) -> None:
        """Move past a draft chosen under :meth:`draft_mask`."""
        if not self._matcher.accept_token(int(token)):
            raise RuntimeError(f"draft {token} was chosen against the grammar")


def grammar_of(spec: GrammarSpec) -> Any:
    """``spec`` as an xgrammar ``Grammar`` (one to compile, or to join to others); ``ConfigError`` saying why where
    xgrammar cannot read it, its setting the constraint's kind."""
    import xgrammar

    try:
        if spec.kind in (GrammarKind.JSON, GrammarKind.JSON_SCHEMA):  # json_object: an object, as OpenAI promises
            schema = ANY_OBJECT if spec.kind is GrammarKind.JSON else json.dumps(compiled_schema(json.loads(spec.text)))
            return xgrammar.Grammar.from_json_schema(schema, max_whitespace_cnt=JSON_WHITESPACE_RUN)
        if spec.kind is GrammarKind.REGEX:
            return xgrammar.Grammar.from_regex(spec.text)
        return xgrammar.Grammar.from_ebnf(spec.text)
    except (RuntimeError, ValueError) as error:
        message = f"the {spec.kind.value} constraint does not compile: {xgrammar_reason(error)}"
        raise ConfigError(message, spec.kind.value) from None


def xgrammar_reason(error: Exception) -> str:
    """The first line of xgrammar's message without its log prefix (``[12:00:00] /project/cpp/file.cc:83: ``)."""
    text = str(error).strip()
    first_line = text.splitlines()[0] if text else type(error).__name__
    return re.sub(r"^\[[\d:]+\]\s+\S+:\d+:\s*", "", first_line)


def allowed_tokens(xgr: Any, bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's bitmask ``[n, ⌈V/32⌉]`` as ``allowed [n, V] bool``."""
    scores = torch.zeros(bitmask.shape[0], vocab_size)  # [n, V]
    xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=vocab_size)
    return scores == 0


def masked(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits [n, V]`` with the tokens not ``allowed [n, V]`` (a host mask, moved to the logits' device) at -inf."""
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


def constrain_step(
    constraint: Constraint | None,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """A step's drafts ``[1, γ]`` (their distributions ``[1, γ, V]``) and target logits ``[γ + 1, V]`` under the
    request's grammar: the drafts up to the first one it forbids, and the target's logits masked at each position
    (unchanged without a grammar); ``GrammarDeadEnd`` where the grammar allows no token next."""
    if constraint is None:
        return draft_token_ids, draft_probs, target_logits
    allowed, valid = constraint.masks(draft_token_ids[0].tolist())  # [valid + 1, V]
    if not bool(allowed[-1].any()):  # a tokenizer that cannot write what the grammar needs next
        raise GrammarDeadEnd("the grammar allows no token of this model's vocabulary after the answer so far")
    draft_probs = None if draft_probs is None else draft_probs[:, :valid]
    return draft_token_ids[:, :valid], draft_probs, masked(target_logits[: valid + 1], allowed)

"""How ``generate``'s options become the library's settings, and which of them contradict each other or are given for
nothing (a note names each: the drafter or policy chosen does not use it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.cli.common import read_text
from quickdraft.drafters import DRAFTERS
from quickdraft.errors import ConfigError

if TYPE_CHECKING:  # the rest imports torch: imported where a command runs, so that --help does not
    from quickdraft.config import GenerationConfig
    from quickdraft.grammar import GrammarSpec


def given(**values: Any) -> dict[str, Any]:
    """The options given on the command line (the rest take the settings' defaults)."""
    return {name: value for name, value in values.items() if value is not None}


def opening(args: argparse.Namespace) -> list[dict[str, str]]:
    """The messages a conversation starts with: ``--system``'s, where given."""
    return [] if args.system is None else [{"role": "system", "content": args.system}]


def logit_bias_of(pairs: list[str]) -> list[tuple[int, float]]:
    """``--logit-bias ID=BIAS`` options as (token id, bias) pairs, in order: ``LogitAdjustments`` checks their range
    and refuses a token given twice."""
    bias = []
    for pair in pairs:
        token, _, value = pair.partition("=")
        try:
            bias.append((int(token), float(value)))
        except ValueError:
            message = f"--logit-bias takes ID=BIAS, a token id and a number, such as 151643=-100: got {pair!r}"
            raise ConfigError(message) from None
    return bias


def check_options(args: argparse.Namespace, config: GenerationConfig) -> None:
    """Refuse options that contradict each other or name a missing file; note those the drafter and policy do not
    use (the output is the same with or without them)."""
    from quickdraft.drafters import HybridDrafter

    spec, drafter = config.policy_spec, DRAFTERS.get(args.drafter)
    if args.num_draft_tokens is not None and spec.kind.uses_num_draft_tokens and not spec.reads_num_draft_tokens:
        raise ConfigError(
            f"--policy {spec} and --num-draft-tokens {args.num_draft_tokens} both give the drafts per step: "
            "give the number once"
        )
    if args.interactive:  # a conversation on the terminal: turns from standard input, text out as it comes
        alone = {"--suffix": args.suffix is not None, "--compare": args.compare, "--prediction": bool(args.prediction),
                 "--json": args.json, "a prompt of -": args.prompt == "-"}  # fmt: skip
        if any(alone.values()):
            named = ", ".join(option for option, is_given in alone.items() if is_given)
            raise ConfigError(f"--interactive reads its turns from standard input and streams their answers: {named} "
                              "goes with one prompt; drop it, or --interactive")  # fmt: skip
    if args.system is not None and not args.system.strip():
        raise ConfigError("--system is empty: give the system message's text, or leave --system out")
    if args.suffix is not None and args.system is not None:
        raise ConfigError("--suffix asks for the text between the prompt and a suffix, --system for a chat reply: "
                          "give one")  # fmt: skip
    if args.suffix is not None and args.chat:
        raise ConfigError("--suffix asks for the text between the prompt and a suffix, --chat for a reply: give one")
    for option, path in (("--acceptance-head", args.acceptance_head), ("--draft-head", args.draft_head)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{option} {path}: no such file")
    sampling = {
        "--seed": args.seed is not None, "--top-p": args.top_p != 1.0, "--top-k": args.top_k != 0,
        "--min-p": args.min_p != 0,
    }  # fmt: skip
    if args.temperature == 0 and any(sampling.values()):
        named = [option for option, is_given in sampling.items() if is_given]
        verb, pronoun = ("applies", "it") if len(named) == 1 else ("apply", "them")
        raise ConfigError(f"{', '.join(named)} only {verb} to sampling: give a --temperature above 0 with {pronoun}")
    kind, drafts = spec.kind, drafter.proposes_drafts
    by_policy = {  # option: given, yet not used by the policy (plain decoding: no policy chooses anything)
        "--policy": args.policy is not None and not drafts,
        "--num-draft-tokens": args.num_draft_tokens is not None and not (drafts and kind.uses_num_draft_tokens),
        "--max-draft-tokens": args.max_draft_tokens is not None and not (drafts and kind.uses_max_draft_tokens),
        "--recalibrate": args.recalibrate and not (drafts and (kind.needs_cost_model or kind.learns_answers)),
        "--acceptance-head": args.acceptance_head is not None and not (drafts and kind.needs_acceptance_head),
    }
    policy = f"the {spec.name} policy" if drafts else f"the {args.drafter} drafter (plain decoding)"
    # the n-gram sizes are of what it copies: the context, or a --prediction
    copies = drafter.copies_context or (args.prediction is not None and drafter.follows_predictions)
    by_drafter = {
        "--draft-head": args.draft_head is not None and not drafter.needs_draft_head,
        "--prompt-lookup-max-ngram": args.prompt_lookup_max_ngram is not None and not copies,
        "--prompt-lookup-min-ngram": args.prompt_lookup_min_ngram is not None and not copies,
        "--hybrid-min-ngram": args.hybrid_min_ngram is not None and not (copies and issubclass(drafter, HybridDrafter)),
    }
    if args.logprobs is not None and not args.json:
        print("quickdraft: note: --logprobs is shown in --json's output only: ignored", file=sys.stderr)
    for option in ("--chat-template", "--chat-template-kwargs"):
        if getattr(args, option[2:].replace("-", "_")) is not None and not args.chat:
            print(f"quickdraft: note: {option} is not used without --chat (the prompt is plain text)", file=sys.stderr)
    if args.compare and not drafts:
        print(
            f"quickdraft: note: the {args.drafter} drafter is plain decoding: --compare times it against itself",
            file=sys.stderr,
        )
    for unused, by in ((by_policy, policy), (by_drafter, f"the {args.drafter} drafter")):
        for option in (option for option, is_unused in unused.items() if is_unused):
            print(f"quickdraft: note: {option} is not used by {by}", file=sys.stderr)


def grammar_of(args: argparse.Namespace) -> GrammarSpec | None:
    """The structured-output flag given, if any (they exclude each other)."""
    from quickdraft.grammar import GrammarKind, GrammarSpec

    if args.json_object:
        return GrammarSpec(GrammarKind.JSON)
    if args.json_schema:
        return GrammarSpec(GrammarKind.JSON_SCHEMA, read_text("--json-schema", args.json_schema))
    if args.regex is not None:
        return GrammarSpec(GrammarKind.REGEX, args.regex)
    return GrammarSpec(GrammarKind.EBNF, read_text("--grammar", args.grammar)) if args.grammar else None

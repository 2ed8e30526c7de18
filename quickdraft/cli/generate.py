"""``quickdraft generate``: one request, streamed, with speculative decoding."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.cli.common import (
    add_chat_template_argument,
    add_model_arguments,
    draft_for,
    gpu_note,
    load_models,
    read_prompt,
    read_text,
)
from quickdraft.cli.generate_options import check_options, given, grammar_of, logit_bias_of, opening
from quickdraft.drafters import DEFAULT_DRAFTER, DRAFTERS
from quickdraft.errors import ConfigError
from quickdraft.progress import progress_bar
from quickdraft.prompts import thinking_of

if TYPE_CHECKING:  # the rest imports torch: imported where a command runs, so that --help does not
    from quickdraft.api import PolicySetup
    from quickdraft.config import GenerationConfig
    from quickdraft.engine import GenerationResult


def add_command(commands: Any, name: str, summary: str) -> None:
    generate = commands.add_parser(
        name,
        help=summary,
        description="Generate a continuation of PROMPT (or of standard input with -), a chat reply (--chat) or a "
        "conversation (-i). Streams the text to stdout and the statistics to stderr; --json prints one JSON object "
        "instead.",
    )
    generate.add_argument("prompt", nargs="?", help="the prompt text, or - to read it from standard input")
    generate.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn of the chat template")
    generate.add_argument(
        "-i", "--interactive", action="store_true", help="a conversation: each line of standard input is a user "
        "turn (the prompt, if given, the first), answered after the turns before it; /reset starts anew, /exit ends, "
        "/help says more",
    )  # fmt: skip
    generate.add_argument(
        "--system", metavar="TEXT", help="a system message before the user's turn, in place of the template's own "
        "(implies --chat; with -i it opens every conversation, /reset included)",
    )  # fmt: skip
    generate.add_argument(
        "--suffix", metavar="FILE", help="fill in the middle: the answer is the text between the prompt and the text "
        "in FILE, asked in the tokenizer's fill-in-the-middle format (code models: Qwen2.5-Coder, StarCoder, ...)",
    )  # fmt: skip
    add_chat_template_argument(generate)
    add_model_arguments(generate)
    generate.add_argument(
        "--drafter",
        default=DEFAULT_DRAFTER,
        help=f"how drafts are made: {', '.join(DRAFTERS.names())} (default: {DEFAULT_DRAFTER}: copies from the "
        "context and from earlier answers where they repeat, the draft model elsewhere; none = plain decoding)",
    )
    generate.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        metavar="K",
        help="drafts per step γ of the fixed policy, where the heuristic one starts (default 4); "
        "given without --policy it means --policy fixed",
    )
    generate.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help="how γ is chosen before each step: goodput (the default: the γ, 0 included, with the most expected "
        "tokens per second from measured costs and the observed acceptance; it measures the costs the first time, "
        "up to two minutes, and saves them), fixed[:K], heuristic (+2 after a fully accepted block, -1 otherwise), "
        "confidence[:T] (stop drafting when the draft's top probability < T), specdec++[:T] (stop when a trained "
        "head puts P(a rejection in the block) above T)",
    )
    generate.add_argument(
        "--recalibrate",
        action="store_true",
        help="measure goodput's costs again instead of loading the saved ones (after a hardware or code change), "
        "and forget the acceptance and answer lengths it learned from earlier runs",
    )
    generate.add_argument(
        "--max-draft-tokens", type=int, metavar="K", help="largest γ of adaptive policies (default 16)"
    )
    generate.add_argument(
        "--acceptance-head",
        metavar="FILE",
        help="SpecDec++ head for --policy specdec++[:T] (default: the one train-acceptance-head wrote for the draft)",
    )
    generate.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="token budget (default 128)")
    generate.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    generate.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="nucleus mass in [0, 1] (default 1 = off; 0: top token)"
    )
    generate.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest (0 = off)")
    generate.add_argument("--seed", type=int, default=None, metavar="S", help="seed for sampling (reproducible runs)")
    generate.add_argument(
        "--min-p", type=float, default=0.0, metavar="P", help="sample only tokens at least P times as likely as the "
        "likeliest (0 = off)",
    )  # fmt: skip
    generate.add_argument(
        "--logit-bias", action="append", default=[], metavar="ID=BIAS", help="add BIAS in [-100, 100] to the logit "
        "of the token with id ID (repeatable; -100 bans the token, 100 all but forces it)",
    )  # fmt: skip
    generate.add_argument(
        "--presence-penalty", type=float, default=0.0, metavar="X", help="OpenAI's: subtract X in [-2, 2] from the "
        "logit of every token the answer already holds (default 0)",
    )  # fmt: skip
    generate.add_argument(
        "--frequency-penalty", type=float, default=0.0, metavar="X", help="OpenAI's: subtract X in [-2, 2] times "
        "the number of times the answer holds a token from its logit (default 0)",
    )  # fmt: skip
    generate.add_argument(
        "--repetition-penalty", type=float, default=1.0, metavar="R", help="transformers' and vLLM's: a token of the "
        "prompt or the answer has its logit divided by R if positive, multiplied by R if not (1 = off)",
    )  # fmt: skip
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    generate.add_argument(
        "--stop-token-id", action="append", type=int, default=[], metavar="ID",
        help="a token id that ends the answer, as the end-of-sequence tokens do (repeatable)",
    )  # fmt: skip
    generate.add_argument(
        "--min-tokens", type=int, default=0, metavar="N",
        help="the answer cannot end before N new tokens: its end tokens are masked and stop strings not looked for "
        "(default 0)",
    )  # fmt: skip
    generate.add_argument(
        "--ignore-eos", action="store_true", help="the end-of-sequence tokens do not end the answer (benchmarks)"
    )
    constraint = generate.add_mutually_exclusive_group()
    constraint.add_argument("--json-object", action="store_true", help="the answer is a JSON object (structured)")
    constraint.add_argument("--json-schema", metavar="FILE", help="the answer follows the JSON schema in FILE")
    constraint.add_argument("--regex", metavar="REGEX", help="the answer matches REGEX")
    constraint.add_argument("--grammar", metavar="FILE", help="the answer follows the EBNF grammar in FILE")
    generate.add_argument("--prompt-lookup-max-ngram", type=int, metavar="N", help="default 3")
    generate.add_argument("--prompt-lookup-min-ngram", type=int, metavar="N", help="default 1")
    generate.add_argument(
        "--hybrid-min-ngram", type=int, metavar="N", help="the hybrid copies after a match this long (2)"
    )
    generate.add_argument(
        "--prediction",
        metavar="FILE",
        help="the answer you expect, e.g. the file being edited (OpenAI's Predicted Outputs): the hybrid drafters "
        "copy it as drafts where the answer follows it; the output is the same",
    )
    generate.add_argument(
        "--compare",
        action="store_true",
        help="also run plain decoding (--drafter none) on the same request and report the speedup and "
        "whether the tokens are identical",
    )
    generate.add_argument(
        "--json", action="store_true", help="print one JSON object: text, token_ids, stats, paths, pairing"
    )
    generate.add_argument(
        "--logprobs",
        type=int,
        metavar="K",
        help="with --json: each new token's log-probability and those of the K likeliest tokens there (0-20), "
        "under the sampling settings (an alternative they exclude is not listed)",
    )
    generate.set_defaults(handler=run)


PROGRESS_PROMPT_TOKENS = 4096  # a prompt this long gets a progress bar while it is read (tens of seconds)


@contextlib.contextmanager
def prompt_progress(engine: Any, prompt_tokens: int, show: bool) -> Iterator[None]:
    """A progress bar (tokens read, rate, time left) on stderr while a long prompt is read."""
    if not show or prompt_tokens < PROGRESS_PROMPT_TOKENS:
        yield
        return

    bar = progress_bar(total=prompt_tokens, unit="tok", desc="reading the prompt", leave=False)
    previous = engine.on_step

    def on_step(report: Any) -> None:
        if report.prefill_tokens and bar.n < bar.total:
            bar.update(min(report.prefill_tokens, bar.total - bar.n))
        if previous is not None:
            previous(report)

    engine.on_step = on_step
    try:
        yield
    finally:
        engine.on_step = previous
        bar.close()


def run(args: argparse.Namespace) -> None:
    from quickdraft.config import GenerationConfig, LogitAdjustments, SamplingParams
    from quickdraft.drafters import DrafterOptions
    from quickdraft.engine import Request

    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.num_draft_tokens,
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p, args.seed, args.min_p),
        stop=tuple(args.stop),
        min_tokens=args.min_tokens,
        ignore_eos=args.ignore_eos,
        stop_token_ids=tuple(args.stop_token_id),
        policy=args.policy,
        grammar=grammar_of(args),
        logprobs=args.logprobs,
        adjustments=LogitAdjustments(
            logit_bias_of(args.logit_bias), args.presence_penalty, args.frequency_penalty, args.repetition_penalty
        ),
        **given(max_draft_tokens=args.max_draft_tokens),
    )
    args.chat = args.chat or args.interactive or args.system is not None  # turns go through the chat template
    ngram_sizes = ("prompt_lookup_max_ngram", "prompt_lookup_min_ngram", "hybrid_min_ngram")
    options = DrafterOptions(**given(**{name: getattr(args, name) for name in ngram_sizes}))
    check_options(args, config)
    if not args.json:  # log-probabilities are shown in --json's output only: checked, not computed
        config = replace(config, logprobs=None)
    suffix = None if args.suffix is None else read_text("--suffix", args.suffix)
    prompt = None if args.interactive else read_prompt(args, empty_ok=suffix is not None)
    draft = draft_for(args, [args.drafter])
    pipeline = load_models(args, draft)
    pipeline.draft_head = Path(args.draft_head) if args.draft_head else None
    tags = thinking_of(str(pipeline.tokenizer.chat_template)) if args.chat else None
    if tags is not None:  # a thinking template's tags keep their text where they are special tokens (Magistral's)
        config = replace(config, kept_special_tokens=(tags.open, tags.close))
    if args.interactive:
        from quickdraft.cli.conversation import converse

        pipeline.drafter(args.drafter, options)  # a drafter these models cannot run fails before any measuring
        setup = ready_policy(pipeline, args, config)
        try:
            converse(pipeline, args, config, options)
        except BaseException:  # Ctrl-C at the prompt ends a conversation too: what it taught the policy is kept,
            with contextlib.suppress(Exception):  # and the error that ended it is the one reported
                pipeline.save_learned(args.drafter, setup)
            raise
        pipeline.save_learned(args.drafter, setup)
        return
    if suffix is None:
        prompt_ids = (
            pipeline.encode_chat([*opening(args), {"role": "user", "content": prompt}], None, args.chat_template_kwargs)
            if args.chat
            else pipeline.encode(prompt, template_kwargs=args.chat_template_kwargs)
        )
    else:  # ends at the model's end tokens and its format's too, as llama.cpp ends an infill
        prompt_ids = pipeline.encode_infill(prompt, suffix)
        config = replace(config, stop_token_ids=config.stop_token_ids + tuple(sorted(pipeline.infill_end_ids())))
    prediction_ids: list[int] = []
    if args.prediction:
        prediction = read_text("--prediction", args.prediction)
        if not prediction.strip():
            message = f"--prediction {args.prediction} holds no text: give the text the answer is likely to repeat"
            raise ConfigError(message)
        prediction_ids = pipeline.encode(prediction)
    drafter = pipeline.drafter(args.drafter, options)  # a drafter these models cannot run fails before any measuring
    pipeline.engine.check_request(Request(tuple(prompt_ids), config, drafter, prediction_ids=tuple(prediction_ids)))
    setup = ready_policy(pipeline, args, config)
    if args.compare:  # warm both paths up so neither run pays first-call costs
        warm_up = GenerationConfig(max_new_tokens=2, num_draft_tokens=1, sampling=config.sampling)  # drafts once
        for drafter in (args.drafter, "none"):
            pipeline.generate(prompt_ids, warm_up, drafter, options=options)
        pipeline.drafter(args.drafter, options).forget()  # the timed run reads the prompt itself, as the plain one does
    stream = pipeline.stream(prompt_ids, config, args.drafter, options=options, prediction=prediction_ids)
    with prompt_progress(pipeline.engine, len(prompt_ids), show=not args.json):
        if not args.json:
            for delta in stream:
                sys.stdout.write(delta)
                sys.stdout.flush()
            sys.stdout.write("\n")
        result = stream.finish()
    pipeline.save_learned(args.drafter, setup)
    comparison = None
    if args.compare:
        plain = pipeline.generate(prompt_ids, config, "none")
        comparison = {
            "plain_stats": plain.stats.to_dict(),
            "speedup": speedup(result, plain),
            "identical_tokens": result.token_ids == plain.token_ids,
        }
    if args.json:
        logprobs = None
        if result.logprobs is not None:
            from quickdraft.vocabularies import token_pieces

            pieces = token_pieces(pipeline.tokenizer)
            logprobs = [logprob_json(pipeline, pieces, entry) for entry in result.logprobs]
        output: dict[str, Any] = {
            "text": result.text,
            "token_ids": result.token_ids,
            "finish_reason": result.finish_reason,
            "stop_reason": result.stop_reason,  # the stop string or stop token id that ended it
            "stats": result.stats.to_dict(),
            "logprobs": logprobs,
            "drafter": args.drafter,
            "policy": str(config.policy_spec),
            "calibration": None if setup.calibration is None else describe(setup, config),  # the costs' source
            "target": str(pipeline.target_path),
            "draft": None if pipeline.draft_path is None else str(pipeline.draft_path),
            "pairing": pipeline.pairing(),  # how the draft drafts: in the target's vocabulary or across
            "runtime": pipeline.target.name,
            "device": str(pipeline.target.device),
            **({} if comparison is None else {"compare": comparison}),
        }
        print(json.dumps(output))
        return
    print(f"[{args.drafter}, finish: {result.finish_reason}] {result.stats.summary()}", file=sys.stderr)
    if comparison is not None:
        print(f"[none (plain decoding)] {plain.stats.summary()}", file=sys.stderr)
        same = "yes" if comparison["identical_tokens"] else "no"
        if not config.sampling.is_greedy and not config.sampling.is_seeded:
            same += " (sampled without --seed: equal distributions, not equal tokens, are what is guaranteed)"
        elif config.sampling.is_seeded and not comparison["identical_tokens"]:
            same += " (seeded: equal tokens are guaranteed, please report this)"
        print(f"speedup over plain decoding: {comparison['speedup']:.2f}x | identical tokens: {same}", file=sys.stderr)


def ready_policy(pipeline: Any, args: argparse.Namespace, config: GenerationConfig) -> PolicySetup:
    """The drafter's policy set up, its costs' source said on stderr (and before timing them, a wait of minutes)."""
    if not args.json and measures_costs(pipeline, args.drafter, config, args.recalibrate):  # else a silent wait
        print(f"[{config.policy}] timing this machine's costs, once for these models ...", file=sys.stderr)
    setup = pipeline.setup_policy(
        args.drafter,
        config,
        recalibrate=args.recalibrate,
        acceptance_head=Path(args.acceptance_head) if args.acceptance_head else None,
        keep_learning=True,
        chat=args.chat,
    )
    if setup.calibration is not None and not args.json:
        print(f"[{config.policy}] {describe(setup, config)}", file=sys.stderr)
    if pipeline.target.device.type != "cpu" and not args.json:
        print(f"quickdraft: note: {gpu_note(pipeline.target.device)}", file=sys.stderr)
    return setup


def logprob_json(pipeline: Any, pieces: list[bytes], entry: Any) -> dict[str, Any]:
    """A new token's log-probability and its alternatives', each with its text as the server spells it (a word
    keeps its space: :func:`~quickdraft.vocabularies.spelled`)."""
    from quickdraft.vocabularies import spelled

    def token(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token_id": token_id, "text": spelled(pipeline.tokenizer, pieces, token_id)[0], "logprob": logprob}

    return token(entry.token_id, entry.logprob) | {"top": [token(*alternative) for alternative in entry.top]}


def measures_costs(pipeline: Any, drafter: str, config: GenerationConfig, recalibrate: bool) -> bool:
    """Whether setting up ``config``'s policy for ``drafter`` will time costs: none saved for them, or asked to."""
    drafter_cls = DRAFTERS.get(drafter)
    if not drafter_cls.proposes_drafts or not config.policy_spec.kind.needs_cost_model:
        return False
    saved = pipeline.calibrations.cost_model_file(drafter_cls, config.max_draft_tokens)
    return recalibrate or (saved is not None and not saved.exists())


def describe(setup: PolicySetup, config: GenerationConfig) -> str:
    """Where the policy's costs came from, what they say, and how many earlier answers it starts from."""
    assert setup.calibration is not None
    costs = setup.calibration.cost_model
    reading = ""
    if costs.draft_prefill_ms:
        longest = max(costs.draft_prefill_ms)
        reading = f"; reading {longest} prompt tokens costs the draft {costs.draft_read(longest):.0f} ms"
    answers = setup.earlier_answers
    return (
        f"{setup.calibration.describe()}: target {costs.target(1):.0f} ms for 1 token, "
        f"{costs.target(config.max_draft_tokens + 1):.0f} ms for {config.max_draft_tokens + 1}; "
        f"{costs.draft_ms:.0f} ms per drafted token{reading}; "
        f"learned from {answers} earlier answer{'' if answers == 1 else 's'}"
    )


def speedup(speculative: GenerationResult, plain: GenerationResult) -> float:
    """Ratio of tokens/s (sampled runs may stop at different lengths)."""
    return (speculative.stats.tokens_per_s or 0.0) / (plain.stats.tokens_per_s or float("inf"))

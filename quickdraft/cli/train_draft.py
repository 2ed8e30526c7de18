"""``quickdraft train-draft``: collect the target's own conversations and features, train a draft head on them
(or distill the draft model on them)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from quickdraft.cli.common import add_cache_arguments, add_runtime_argument, check_output_dir, check_output_file
from quickdraft.errors import ConfigError
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET

DEFAULT_VOCABULARY = 32768  # tokens the head drafts unless --vocabulary says otherwise

DOC = """\
Train a draft head for the eagle drafter on the target's own text (nothing from any benchmark).

1. collect: the target writes conversations itself (Magpie: it fills the chat template's user turn, sometimes
   after a generic opener, then answers), many side by side; each position's hidden states after the head's
   feature layers and the target's top-k next tokens are saved in shards of --sequences-per-shard
   conversations. Stopped, it resumes at the first missing shard (shards are seeded by their index).
2. train: a frequency-ranked vocabulary from the training shards, one decoder layer over the target's
   features trained to match the target's next-token distribution at --unroll drafting depths; the last
   --held-out-shards shards measure agreement. Resumes from its checkpoint after each epoch.
3. writes the head (safetensors, with its settings, data and results as metadata) and prints its sha256.

With --model draft, step 2 distills the draft model instead: low-rank adapters on its projections learn the
target's top-k at every position (--epochs 1, --learning-rate 2e-4 by default), merged into a model directory
(--out, default $QUICKDRAFT_CACHE/distilled/<draft>-for-<target>) to pass as --draft DIR.
"""


def add_command(commands: Any, name: str, summary: str) -> None:
    parser = commands.add_parser(
        name,
        help=summary,
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, metavar="PATH", help=f"target model (default {DEFAULT_TARGET})"
    )
    parser.add_argument(
        "--model",
        choices=("head", "draft"),
        default="head",
        help="what to train: a draft head for the eagle drafters (default) or the draft model, distilled",
    )
    parser.add_argument("--draft", metavar="PATH", help=f"draft model for --model draft (default {DEFAULT_DRAFT})")
    add_runtime_argument(parser)
    add_cache_arguments(parser)
    parser.add_argument("--data", metavar="DIR", help="collected data (default $QUICKDRAFT_CACHE/draft-data/<target>)")
    parser.add_argument(
        "--out",
        metavar="PATH",
        help="the head (default $QUICKDRAFT_CACHE/draft-heads/<target>.safetensors) or, for --model draft, the "
        "distilled model's directory",
    )
    parser.add_argument("--shards", type=int, default=8, metavar="N", help="collect until N shards exist (default 8)")
    parser.add_argument(
        "--sequences-per-shard", type=int, default=128, metavar="N", help="conversations per shard (128)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, metavar="N", help="conversations written side by side (32)"
    )
    parser.add_argument("--max-answer-tokens", type=int, default=320, metavar="N", help="answer length cap (320)")
    parser.add_argument("--collect-only", action="store_true", help="collect, do not train")
    parser.add_argument(
        "--epochs", type=float, metavar="E", help="passes over the training shards (default 2.5; 1 for --model draft)"
    )
    parser.add_argument("--unroll", type=int, default=2, metavar="J", help="drafting depths trained (default 2)")
    parser.add_argument(
        "--learning-rate", type=float, metavar="LR", help="peak learning rate (1e-3; 2e-4 for --model draft)"
    )
    parser.add_argument("--rank", type=int, metavar="R", help="adapter rank for --model draft (16)")
    parser.add_argument(
        "--tokens-per-batch", type=int, default=1024, metavar="N", help="positions per training batch (1024)"
    )
    parser.add_argument("--intermediate-size", type=int, default=4096, metavar="N", help="the head's MLP width (4096)")
    parser.add_argument(
        "--vocabulary", type=int, default=DEFAULT_VOCABULARY, metavar="N",
        help=f"tokens the head drafts ({DEFAULT_VOCABULARY})",
    )  # fmt: skip
    parser.add_argument("--held-out-shards", type=int, default=1, metavar="N", help="shards kept for measuring (1)")
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the synthesis and the training (default 0)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    import torch

    from quickdraft.api import Pipeline
    from quickdraft.draft_head.collect import Collector, CollectSettings
    from quickdraft.draft_head.data import FeatureData
    from quickdraft.draft_head.file import default_head_path, save_head
    from quickdraft.draft_head.train import TrainSettings, build_head, choose_vocabulary, train_head
    from quickdraft.files import cache_root, model_key

    if args.shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {args.shards}")
    for option, value in (("--epochs", args.epochs), ("--learning-rate", args.learning_rate)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{option} must be a finite number > 0, got {value}")
    if args.out is not None and not args.collect_only:  # checked before hours of collecting and training
        if args.model == "draft":
            from quickdraft.draft_head.distill import check_output

            check_output_dir(Path(args.out))
            check_output(Path(args.out))
        else:
            check_output_file(Path(args.out))
    if not args.collect_only and not 0 <= args.held_out_shards < args.shards:
        held_out = args.held_out_shards
        raise ConfigError(f"--held-out-shards must be >= 0 and fewer than --shards {args.shards}, got {held_out}")
    if args.data is not None:
        check_output_dir(Path(args.data), "--data")
    # both trainers' settings; --epochs and --learning-rate default to each trainer's own
    shared = {"tokens_per_batch": args.tokens_per_batch, "held_out_shards": args.held_out_shards, "seed": args.seed}
    shared |= {name: value for name in ("epochs", "learning_rate") if (value := getattr(args, name)) is not None}
    if args.model == "draft":
        from quickdraft.draft_head.distill import DistillSettings

        distill_settings = DistillSettings(**shared, **({"rank": args.rank} if args.rank is not None else {}))
    collect_settings = CollectSettings(
        sequences_per_shard=args.sequences_per_shard,
        batch_size=args.batch_size,
        max_answer_tokens=args.max_answer_tokens,
        seed=args.seed,
    )
    train_settings = TrainSettings(
        steps=args.unroll, intermediate_size=args.intermediate_size, vocabulary_size=args.vocabulary, **shared
    )
    # notes once every setting is known to be valid: an error is then the one line printed
    for option, value in (("--rank", args.rank), ("--draft", args.draft)):
        if value is not None and args.model != "draft" and not args.collect_only:
            note = f"{option} applies to the draft model's distillation (--model draft)"
            print(f"quickdraft: note: {note}", file=sys.stderr)
    head_only = {"--unroll": args.unroll != 2, "--intermediate-size": args.intermediate_size != 4096,
                 "--vocabulary": args.vocabulary != DEFAULT_VOCABULARY}  # fmt: skip
    training = {
        "--out": args.out is not None,
        "--epochs": args.epochs is not None,
        "--learning-rate": args.learning_rate is not None,
        "--tokens-per-batch": args.tokens_per_batch != 1024,
        "--held-out-shards": args.held_out_shards != 1,
        "--rank": args.rank is not None,
        "--draft": args.draft is not None,
    }
    unused = [flag for flag, given in (training | head_only).items() if given and args.collect_only]
    unused += [flag for flag, given in head_only.items() if given and args.model == "draft" and not args.collect_only]
    if unused:
        why = "--collect-only trains nothing" if args.collect_only else "--model draft trains no head"
        print(f"quickdraft: note: {', '.join(unused)} not used: {why}", file=sys.stderr)
    pipeline = Pipeline.load(
        args.target, None, args.runtime, device=args.device, kv_cache_dtype=args.kv_cache_dtype,
        max_context=args.max_context,
    )  # fmt: skip
    name = model_key(Path(pipeline.target_path))
    asked, held = args.vocabulary, pipeline.target.vocab_size
    if args.model == "head" and not args.collect_only and asked != DEFAULT_VOCABULARY and asked > held:
        note = f"--vocabulary {asked} is more than the target's {held} tokens: the head predicts them all"
        print(f"quickdraft: note: {note}", file=sys.stderr)  # the settings keep it: a checkpoint of them resumes
    data_dir = Path(args.data) if args.data else cache_root() / "draft-data" / name
    collector = Collector(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, name, collect_settings)
    # the draft model and where it goes are checked before the hours of collecting
    draft = distill_draft(args, pipeline, name) if args.model == "draft" and not args.collect_only else None

    def shard_done(report: Any) -> None:
        if not args.json:
            print(
                f"shard {report.index}: {report.sequences} conversations, {report.tokens} tokens "
                f"({report.answer_tokens} in answers), {report.seconds} s",
                file=sys.stderr,
            )

    collector.collect(data_dir, args.shards, on_shard=shard_done)
    if args.collect_only:
        if args.json:
            print(json.dumps({"data": str(data_dir), "shards": args.shards}))
        return
    data = FeatureData(data_dir)
    if draft is not None:
        run_distill(args, name, draft, data, data_dir, distill_settings)
        return
    train, held_out = data.split(train_settings.held_out_shards)
    train_shards = sorted({c.shard for c in train})
    vocabulary, coverage = choose_vocabulary(
        data, train_shards, train_settings.vocabulary_size, pipeline.target.vocab_size
    )
    decoder_config = pipeline.target.decoder.config  # type: ignore[attr-defined]
    embedding = pipeline.target.embed_tokens(torch.arange(pipeline.target.vocab_size))  # [V, H]
    head = build_head(data, decoder_config, pipeline.target.lm_head_rows, vocabulary, train_settings)
    out = Path(args.out) if args.out else default_head_path(name)
    checkpoint = checkpoint_path(out, data_dir, train)
    history = train_head(head, data, train, held_out, embedding, train_settings, checkpoint, on_eval=on_eval(args))
    made = {
        "data": {
            "directory": str(data_dir),
            "shards": len(data.shards),
            "conversations": len(data.conversations),
            "train_tokens": sum(c.length for c in train),
            "held_out_tokens": sum(c.length for c in held_out),
            "collect_settings": asdict(collect_settings) | {"feature_layers": list(collector.layers)},
            "vocabulary_coverage": round(coverage, 4),
            "vocabulary_size": len(vocabulary),  # at most the target's, whatever train_settings asked for
        },
        "train_settings": asdict(train_settings),
        "history": history,
        "torch": torch.__version__,
    }
    sha256 = save_head(head, out, collector.layers, name, made)
    checkpoint.unlink(missing_ok=True)  # done: a later run with other data or settings starts afresh
    report = {"head": str(out), "sha256": sha256, **made}
    print(json.dumps(report, indent=1) if args.json else f"wrote {out} (sha256 {sha256})")


def checkpoint_path(out: Path, data_dir: Path, train: Any) -> Path:
    """Where training to ``out`` keeps its checkpoint: named by the data it trains on (the collection's manifest and
    its training conversations), so a run on other data never resumes another's training."""
    from quickdraft.draft_head.collect import MANIFEST

    digest = hashlib.sha256((data_dir / MANIFEST).read_bytes())
    digest.update(repr(sorted((c.shard, c.length) for c in train)).encode())
    return out.with_name(f".{out.name}.{digest.hexdigest()[:12]}.checkpoint")


def on_eval(args: argparse.Namespace) -> Callable[[dict[str, Any]], None]:
    """What the trainers call with each evaluation: a line on stderr (nothing with --json)."""
    if args.json:
        return lambda record: None
    return lambda record: print(
        f"after {record['batches']} batches ({record['seconds']} s): {eval_text(record['eval'])}", file=sys.stderr
    )


def eval_text(values: dict[str, Any] | None) -> str:
    """An evaluation's numbers as a line: ``tokens 204, loss 3.073, agreement 0.020 / 0.078``; with no held-out
    shards (``--held-out-shards 0``) there is none, and the line says so."""
    if values is None:
        return "not measured (--held-out-shards 0)"

    def text(value: Any) -> str:
        if isinstance(value, tuple | list):
            return " / ".join(text(part) for part in value)
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    return ", ".join(f"{name.replace('_', ' ')} {text(value)}" for name, value in values.items())


def distill_draft(args: argparse.Namespace, pipeline: Any, target: str) -> tuple[Path, Any, Path]:
    """``--model draft``'s draft model (its directory and tokenizer, the target's, whose key is ``target``) and where
    it will be written: refused before any work if it is missing, pairs with another tokenizer, or the output is not
    its own."""
    from quickdraft.draft_head.distill import check_output
    from quickdraft.files import cache_root, model_key
    from quickdraft.models import resolve_model
    from quickdraft.models.loading import load_tokenizer
    from quickdraft.models.pairing import check_same_tokenizer

    draft_path = resolve_model(args.draft or DEFAULT_DRAFT)
    tokenizer = load_tokenizer(draft_path)
    check_same_tokenizer(pipeline.tokenizer, tokenizer)
    out = Path(args.out) if args.out else cache_root() / "distilled" / f"{model_key(draft_path)}-for-{target}"
    check_output(out)
    return draft_path, tokenizer, out


def run_distill(
    args: argparse.Namespace, target: str, draft: tuple[Path, Any, Path], data: Any, data_dir: Path, settings: Any
) -> None:
    """``--model draft``: distill the draft model (:func:`distill_draft`) for the target whose key is ``target`` on
    the collected data into a model directory."""
    import torch

    from quickdraft.draft_head.distill import distill, save_distilled
    from quickdraft.models.loading import load_hf_model

    draft_path, tokenizer, out = draft
    model = load_hf_model(draft_path)
    train, held_out = data.split(settings.held_out_shards)
    checkpoint = checkpoint_path(out, data_dir, train)
    history = distill(model, data, train, held_out, settings, checkpoint, on_eval=on_eval(args))
    made = {
        "draft": str(draft_path),
        "target": target,
        "data": {
            "directory": str(data_dir),
            "train_tokens": sum(c.length for c in train),
            "held_out_tokens": sum(c.length for c in held_out),
        },
        "distill_settings": asdict(settings),
        "history": history,
        "torch": torch.__version__,
    }
    sha256 = save_distilled(model, tokenizer, out, made)
    checkpoint.unlink(missing_ok=True)
    report = {"model": str(out), "sha256": sha256, **made}
    print(json.dumps(report, indent=1) if args.json else f"wrote {out} (weights sha256 {sha256}); use --draft {out}")

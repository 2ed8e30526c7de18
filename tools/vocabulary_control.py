"""The cross-vocabulary path's control: does a draft accept as much through the translation as directly?

    .venv/bin/python tools/vocabulary_control.py [QUESTIONS.jsonl] [--per-category N] [--tokens N] [--gamma K]
        [--draft NAME_OR_PATH] [--out FILE.json]

The default pair shares one vocabulary. Here its draft model drafts for the target twice on each sampled Spec-Bench
question (first turn, chat, the bench's seed-0 sample), with a fixed γ: directly, and through a
:class:`~quickdraft.vocabularies.VocabularyBridge` between the target's tokenizer and itself, the path a draft of
another vocabulary takes (greedy: string-level; seeded T = 0.7: TLI). Both must give the target's own tokens; the
acceptance rates should agree within noise. ``--draft`` runs the same for any draft instead (a foreign one has no
direct path: its row says so). Prints a table; ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.models import DEFAULT_DRAFT, load_tokenizer
from quickdraft.vocabularies import VocabularyBridge

SAMPLINGS = {"greedy": SamplingParams(), "seeded T=0.7": SamplingParams(temperature=0.7, seed=1)}


def through_bridge(pipeline: Pipeline) -> Pipeline:
    """The same models, the draft behind a bridge between its tokenizer and the target's."""
    assert pipeline.draft is not None and pipeline.draft_path is not None
    bridge = pipeline.bridge or VocabularyBridge(
        pipeline.tokenizer,
        load_tokenizer(pipeline.draft_path),
        pipeline.target.vocab_size,
        pipeline.draft.vocab_size,
    )
    return Pipeline(
        target=pipeline.target,
        tokenizer=pipeline.tokenizer,
        eos_token_ids=pipeline.eos_token_ids,
        target_path=pipeline.target_path,
        draft=pipeline.draft,
        draft_path=pipeline.draft_path,
        bridge=bridge,
        mismatch=pipeline.mismatch or "forced (the control)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per question (default 96)")
    parser.add_argument("--gamma", type=int, default=4, help="fixed drafts per step (default 4)")
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pipeline = Pipeline.load(draft=args.draft, progress=False)
    paths = {"through the bridge": through_bridge(pipeline)}
    if pipeline.bridge is None:
        paths = {"direct": pipeline, **paths}
    questions = sample_questions(load_questions(args.questions), args.per_category, 0)
    prompts = [pipeline.encode(question.turns[0], chat=True) for question in questions]
    rows = []
    for sampling_name, sampling in SAMPLINGS.items():
        config = GenerationConfig(max_new_tokens=args.tokens, policy=f"fixed:{args.gamma}", sampling=sampling)
        plain = [pipeline.generate(prompt, config, drafter="none").token_ids for prompt in prompts]
        for path_name, path in paths.items():
            accepted = proposed = same = 0
            for prompt, reference in zip(prompts, plain, strict=True):
                result = path.generate(prompt, config, drafter="draft-model")
                accepted += result.stats.draft_tokens_accepted
                proposed += result.stats.draft_tokens_proposed
                same += result.token_ids == reference
            row = {"sampling": sampling_name, "path": path_name, "accepted": accepted, "proposed": proposed}
            row |= {"acceptance": accepted / max(1, proposed), "same_as_plain": same, "questions": len(prompts)}
            rows.append(row)
            print(
                f"{sampling_name:13} {path_name:19} acceptance {row['acceptance']:.3f} ({accepted}/{proposed}), "
                f"{same}/{len(prompts)} the same tokens as plain decoding",
                flush=True,
            )
    if args.out:
        settings = {"draft": args.draft, "gamma": args.gamma, "tokens": args.tokens, "questions": len(prompts)}
        args.out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

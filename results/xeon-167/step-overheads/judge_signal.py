"""Which signal predicts whether a seeded draft is accepted: the draft's top probability on its raw logits (what
goodput's judge reads) or at T, the drafted token's probability at T, or the margin of its noisy choice (the best
minus the second best of scores + noise, which the noise known in advance makes available)? A probe, kept beside
its output.

    cd /tmp && .venv/bin/python results/xeon-167/step-overheads/judge_signal.py 0.7

The draft model drafts at fixed γ 4, seeded at T, on the bench's 30 Spec-Bench questions (seed-0 sample, first
turns), 128 tokens; every draft up to a step's first rejection is labelled (accepted or not), as a judge sees them.
Prints the AUC of each signal (0.5: no better than chance).
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from scipy.stats import rankdata

import quickdraft.engine.engine as engine
from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import draft_model
from quickdraft.lossless.sampling import seeded_gumbel

pending: list[dict[str, float]] = []  # this step's drafts, in order
labelled: list[dict[str, float]] = []
draw, verify_drafts = draft_model.draw, engine.verify_drafts


def recording_draw(scores: torch.Tensor, sampling: SamplingParams, generator, position: int):  # type: ignore[no-untyped-def]
    tokens, probs = draw(scores, sampling, generator, position)
    noisy = (scores + seeded_gumbel(sampling.seed, position, scores.shape[-1]))[0]  # [V]
    best, second = torch.topk(noisy, 2).values.tolist()
    q, raw = torch.softmax(scores[0], -1), torch.softmax(scores[0] * sampling.temperature, -1)  # [V] each
    pending.append(
        {
            "raw_top_probability": float(raw.max()),
            "top_probability": float(q.max()),
            "token_probability": float(q[int(tokens[0])]),
            "margin": best - second,
        }
    )
    return tokens, probs


def labelling_verify(draft_token_ids: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
    result = verify_drafts(draft_token_ids, *args, **kwargs)
    num_accepted, drafts = (
        int(result.num_accepted[0]),
        pending[-draft_token_ids.shape[1] :] if draft_token_ids.shape[1] else [],
    )
    labelled.extend(
        {**draft, "accepted": float(i < num_accepted)} for i, draft in enumerate(drafts[: num_accepted + 1])
    )
    pending.clear()
    return result


def auc(labels: np.ndarray, signal: np.ndarray) -> float:
    ranks, positive = rankdata(signal), labels == 1
    count, other = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - count * (count + 1) / 2) / (count * other))


def main() -> None:
    draft_model.draw, engine.verify_drafts = recording_draw, labelling_verify
    temperature = float(sys.argv[1])
    pipeline = Pipeline.load(progress=False)
    config = GenerationConfig(
        max_new_tokens=128, sampling=SamplingParams(temperature=temperature, seed=1), policy="fixed:4"
    )
    for question in sample_questions(load_questions(default_questions_path()), 5, 0):
        pipeline.generate(question.turns[0], config, chat=True, drafter="draft-model")
    labels = np.array([draft["accepted"] for draft in labelled])
    print(f"T {temperature}: {len(labelled)} labelled drafts, accepted {labels.mean():.3f}")
    for signal in ("raw_top_probability", "top_probability", "token_probability", "margin"):
        print(f"{signal} AUC {auc(labels, np.array([draft[signal] for draft in labelled])):.3f}")


if __name__ == "__main__":
    main()

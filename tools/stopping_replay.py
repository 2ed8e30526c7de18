"""When should a block stop drafting? Replays the default pair's drafts along the target's own answers.

    .venv/bin/python tools/stopping_replay.py [QUESTIONS.jsonl] [--per-category N] [--tokens N]
        [--temperatures 0,0.7,1.0] [--noise-seeds N] [--draft-ms MS] [--curve K:MS,...] [--overhead-ms MS]
        [--rows FILE] [--replay-only]

For each sampled Spec-Bench question (first turn, the bench's seed-0 sample) and temperature, the target
decodes ``--tokens`` tokens as seeded plain decoding does (seed 1; greedy at T = 0) and the draft model reads
prompt and answer in one forward, as ``tools/sampling_acceptance.py`` does. At each answer position it records
whether the draft's token (its argmax, or its Gumbel-max choice under the position's noise for seed 1 and
``--noise-seeds`` more) is the target's, and what the drafter could judge it by: its top probability before
(``raw_top``) and after (``proc_top``) the temperature, the drafted token's probability (``q_x``) and the gap
between its best two noisy scores (``margin``, used calibrated only). Rows go to ``--rows`` (jsonl).

Then it replays steps along each answer: a step drafts from where the last one ended; after each drafted token
a judge decides whether to draft another, at most up to a reach; the target accepts the drafts up to the first
one that is not its own token and adds one. A step costs ``drafts · draft_ms + t(drafts + 1) + overhead`` by the
given cost curve (default: the Xeon VM's medians of 2026-11-28). The judge drafts on while survival × β > rate ×
(draft_ms + t(k + 2) − t(k + 1)), survival being the product of the drafts' predicted acceptance (the signal
itself, or calibrated on the other half of the questions), β the mean acceptance. It prints tokens per ms ÷
plain decoding's for each signal and rate, with the reach capped at goodput's planned γ (β, the curve) or 16, the
rate 1 / t(1) (plain decoding's) or the plan's expected tokens per ms, and an oracle that drafts exactly the
accepted run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from sampling_acceptance import Setting, draft_probs, sampled_answer, teacher_forced_logits

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.costs import expected_tokens
from quickdraft.lossless.sampling import argmax, logits_to_probs, position_noise, top_probability
from quickdraft.policies import best_gamma

XEON_CURVE = "1:42.9,2:45.4,4:48.7,5:50.2,8:61.1,12:81.4,16:100.7"
SIGNALS = ("raw_top", "proc_top", "q_x", "margin")


def collect(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(2)
    pipeline = Pipeline.load()
    assert pipeline.draft is not None
    questions = sample_questions(load_questions(args.questions), args.per_category, 0)
    rows: list[dict] = []
    for number, question in enumerate(questions, start=1):
        prompt = pipeline.encode(question.turns[0], chat=True)
        pipeline.draft.focus_vocabulary(prompt)
        target_cache, draft_cache = pipeline.target.new_cache(1), pipeline.draft.new_cache(1)
        target_first = pipeline.target.forward(torch.tensor([prompt]), target_cache, last_only=True)[0, -1]  # [V]
        draft_first = pipeline.draft.forward(torch.tensor([prompt]), draft_cache, last_only=True)[0, -1]
        vocab_size = target_first.shape[-1]
        positions = range(len(prompt), len(prompt) + args.tokens)
        for temperature in args.temperatures:
            setting = Setting(temperature)
            answer, target_logits = sampled_answer(
                pipeline, target_cache, target_first, len(prompt), args.tokens, setting.sampling(1)
            )
            draft_logits = teacher_forced_logits(pipeline.draft, draft_cache, draft_first, len(prompt), answer)
            raw_top = top_probability(draft_logits)  # [T]
            base = {"question_id": question.question_id, "category": question.category, "temperature": temperature}
            if temperature == 0:
                best_two = draft_logits[:, :vocab_size].float().topk(2, dim=-1)
                accept = best_two.indices[:, 0] == torch.tensor(answer)
                margin = best_two.values[:, 0] - best_two.values[:, 1]
                signals = {"raw_top": raw_top, "proc_top": raw_top, "q_x": raw_top, "margin": margin}
                rows.append(
                    {**base, "seed": 1, "accept": accept.tolist(), **{k: v.tolist() for k, v in signals.items()}}
                )
                continue
            sampling = setting.sampling(1)
            target_log = logits_to_probs(target_logits, sampling).log()  # [T, V]
            draft = draft_probs(draft_logits, sampling, vocab_size)  # [T, V]
            for seed in range(1, args.noise_seeds + 2):
                noise = position_noise(seed, positions, vocab_size)[: len(answer)]  # [T, V]
                best_two = (draft.log() + noise).topk(2, dim=-1)
                drafted = best_two.indices[:, 0]  # [T]
                signals = {
                    "raw_top": raw_top,
                    "proc_top": draft.amax(dim=-1),
                    "q_x": draft.gather(-1, drafted[:, None])[:, 0],
                    "margin": best_two.values[:, 0] - best_two.values[:, 1],
                }
                accept = drafted == argmax(target_log + noise)
                rows.append(
                    {**base, "seed": seed, "accept": accept.tolist(), **{k: v.tolist() for k, v in signals.items()}}
                )
        print(f"[{number}/{len(questions)}] {question.category}", file=sys.stderr, flush=True)
    return rows


class Costs:
    """The replay's step costs: the target's curve ``curve[k]`` (ms for k new tokens), a drafted token, and what a
    step takes beyond its forwards. As :class:`quickdraft.policies.StepCosts` (the overhead counted with the
    target's forward), goodput's own planner plans with them."""

    def __init__(self, curve: str, draft_ms: float, overhead_ms: float) -> None:
        points = sorted((int(k), float(v)) for k, v in (item.split(":") for item in curve.split(",")))
        ks, ms = zip(*points, strict=True)
        slope = (ms[-1] - ms[-2]) / (ks[-1] - ks[-2])
        self.curve = {
            k: float(np.interp(k, ks, ms)) if k <= ks[-1] else ms[-1] + slope * (k - ks[-1]) for k in range(1, 40)
        }
        self.draft_ms, self.overhead_ms = draft_ms, overhead_ms

    def target(self, num_tokens: int) -> float:
        return self.curve[num_tokens] + self.overhead_ms

    def draft(self, num_rows: int) -> float:
        return num_rows * self.draft_ms

    def step_ms(self, drafts: int) -> float:
        return self.draft(drafts) + self.target(drafts + 1)

    def plan(self, beta: float, maximum: int = 16) -> tuple[int, float]:
        """goodput's γ at α = β (:func:`best_gamma`) and its expected tokens per ms."""
        gamma = best_gamma(self, beta, maximum)
        return gamma, expected_tokens(beta, gamma) / self.step_ms(gamma)


def replay(
    accept: list[bool],
    survival_of: np.ndarray,
    beta: float,
    costs: Costs,
    reach: int,
    rate: float,
    oracle: bool = False,
) -> tuple[int, float]:
    """Tokens and ms of the steps along one answer."""
    position, tokens, ms = 0, 0, 0.0
    while position < len(accept):
        drafts, survival = 0, 1.0
        while position + drafts < len(accept):
            drafts += 1
            if oracle:
                if not accept[position + drafts - 1]:
                    drafts -= 1
                    break
                if drafts >= reach:
                    break
                continue
            survival *= survival_of[position + drafts - 1]
            next_ms = costs.draft_ms + costs.curve[drafts + 2] - costs.curve[drafts + 1]
            if drafts >= reach or survival * beta <= rate * next_ms:
                break
        accepted = 0
        while accepted < drafts and accept[position + accepted]:
            accepted += 1
        tokens, ms, position = tokens + accepted + 1, ms + costs.step_ms(drafts), position + accepted + 1
    return tokens, ms


def calibration(signal: np.ndarray, accept: np.ndarray, bins: int = 20):
    edges = np.unique(np.quantile(signal, np.linspace(0, 1, bins + 1)))

    def bucket(values: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(edges, values, side="right") - 1, 0, len(edges) - 2)

    index = bucket(signal)
    rates = np.array([(accept[index == b].sum() + 1) / ((index == b).sum() + 2) for b in range(len(edges) - 1)])
    rates = np.maximum.accumulate(rates)  # a surer draft is never judged less likely to be accepted
    return lambda values: rates[bucket(np.asarray(values))]


def report(rows: list[dict], costs: Costs) -> str:
    lines = []
    for temperature in sorted({row["temperature"] for row in rows}):
        chosen = [row for row in rows if row["temperature"] == temperature]
        accept_all = np.concatenate([row["accept"] for row in chosen]).astype(bool)
        beta = float(accept_all.mean())
        planned, planned_rate = costs.plan(beta)
        questions = sorted({row["question_id"] for row in chosen})
        fold = {question: i % 2 for i, question in enumerate(questions)}
        lines.append(
            f"\nT {temperature:g}: {len(accept_all)} positions, acceptance {beta:.3f}, goodput plans γ {planned}"
        )
        header = (
            "| signal | reach γ, rate 1/t(1) | reach γ, plan's rate | reach 16, rate 1/t(1) | reach 16, plan's rate |"
        )
        lines += [header, "|---|---|---|---|---|"]
        for signal in (
            "none",
            *SIGNALS[:3],
            *(f"{s} calibrated" for s in SIGNALS),
            "oracle",
        ):  # a margin is no probability
            cells = []
            for reach, rate in (
                (planned, 1 / costs.curve[1]),
                (planned, planned_rate),
                (16, 1 / costs.curve[1]),
                (16, planned_rate),
            ):
                tokens = ms = 0.0
                for held_out in (0, 1):
                    train = [row for row in chosen if fold[row["question_id"]] != held_out]
                    name = signal.split()[0]
                    predict = None
                    if signal.endswith("calibrated"):
                        predict = calibration(
                            np.concatenate([row[name] for row in train]),
                            np.concatenate([row["accept"] for row in train]).astype(float),
                        )
                    for row in (row for row in chosen if fold[row["question_id"]] == held_out):
                        if signal in ("none", "oracle"):
                            survival_of = np.full(len(row["accept"]), beta)
                        else:
                            survival_of = np.asarray(row[name]) if predict is None else predict(row[name])
                        t, m = replay(
                            row["accept"],
                            survival_of,
                            beta,
                            costs,
                            16 if signal == "oracle" else reach,
                            rate,
                            oracle=signal == "oracle",
                        )
                        tokens, ms = tokens + t, ms + m
                cells.append(f"{tokens / ms * costs.step_ms(0):.3f}×")
            lines.append(f"| {signal} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument(
        "--temperatures", type=lambda text: [float(t) for t in text.split(",")], default=[0.0, 0.7, 1.0]
    )
    parser.add_argument("--noise-seeds", type=int, default=4, help="seeds besides the answer's own (sampled)")
    parser.add_argument("--draft-ms", type=float, default=11.0, help="a drafted token (default: the Xeon VM's)")
    parser.add_argument("--curve", default=XEON_CURVE, help="the target's t(k), k:ms,... (interpolated)")
    parser.add_argument("--overhead-ms", type=float, default=3.0, help="per step beyond the forwards")
    parser.add_argument("--rows", type=Path, default=None, help="jsonl of the recorded positions")
    parser.add_argument("--replay-only", action="store_true", help="replay --rows without running the models")
    args = parser.parse_args()
    if args.replay_only:
        rows = [json.loads(line) for line in args.rows.read_text().splitlines()]
    else:
        rows = collect(args)
        if args.rows is not None:
            args.rows.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(report(rows, Costs(args.curve, args.draft_ms, args.overhead_ms)))


if __name__ == "__main__":
    main()

"""Where does a sampled draft's acceptance go, by temperature, and what could each lossless technique add?

    .venv/bin/python tools/sampling_acceptance.py [QUESTIONS.jsonl] [--per-category N] [--tokens N]
        [--settings 0,0.7,1.0,0.7:0.95] [--seed S] [--noise-seeds N] [--gamma N] [--samples N] [--limit N] [--out DIR]

The sampled counterpart of ``tools/draft_agreement.py``. For each sampled Spec-Bench question (first turn, the
bench's seed-0 sample) and each setting (``T`` or ``T:top_p``), the target decodes ``--tokens`` tokens as seeded
plain decoding does (the Gumbel-max choice under ``seeded_gumbel(seed, position)``; greedy at T = 0), keeping
its logits; the default draft model (its default weights and vocabulary, focused on the prompt as the drafter
does) then reads prompt and answer in one forward. Both are processed with the setting (``logits_to_probs``),
p_t for the target and q_t for the draft, and scored at every answer position t:

- ``sum_min``: Σ_v min(p_t, q_t), the acceptance probability of one draft under rejection sampling (unseeded).
- ``coupled``: the draft's seeded token argmax(log q_t + g) equals the target's argmax(log p_t + g) under the same
  noise g (seeded coupling). ``on-path``: the noise that made the answer; ``avg``: ``--noise-seeds`` other seeds.
- ``seeded top-k``: the target's Gumbel token is among the k largest log q_t + g (avg over the other seeds):
  what k siblings drawn with the shared noise accept (Gumbel-top-k: k draws from q without replacement).
- unseeded k drafts: ``iid`` SpecInfer's recursive rejection with k i.i.d. drafts from q (exact: each round
  accepts with Σ min(p_i, q), p_{i+1} = norm(max(p_i - q, 0))); ``w/o-repl`` the same with drafts without
  replacement (q renormalized without the drafts drawn; the rejected drafts sampled ``--samples`` times per
  position, each round's acceptance exact given them); ``bound`` SpecTr's upper bound for k i.i.d. drafts,
  Σ min(p, 1 - (1 - q)^k).
- draft shaping: ``sum_min`` and ``coupled`` (avg) with the draft processed at 0.5, 0.75, 1 and 1.25 x T.
- tokens per step of a γ-chain (``--gamma``), and of one with k - 1 siblings at every depth (a step that stops at
  depth j gains one token when a sibling is accepted there): from per-position acceptance a_t taken as independent,
  1 + a_t + a_t a_{t+1} + ... averaged over start positions (unseeded: sum_min, wor; seeded: coupled, top-k and the
  on-path matches), and the seeded on-path chain replayed along the answer (exact: a step starts after the last).

Prints the tables and writes ``acceptance.json`` (per question and setting: token-pooled sums) and
``acceptance.txt`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.api import Pipeline
from quickdraft.bench.questions import Question, default_questions_path, load_questions, sample_questions
from quickdraft.config import SamplingParams
from quickdraft.lossless.rules import choose_token
from quickdraft.lossless.sampling import argmax, gumbel_argmax, logits_to_probs, position_noise
from quickdraft.lossless.verify import residual_probs
from quickdraft.runtime.base import KVCache, Runtime

CANDIDATES = (1, 2, 3)  # k: drafts per position
SHAPING = (0.5, 0.75, 1.0, 1.25)  # draft temperature / target temperature
SUPPORT_FLOOR = 1e-9  # the without-replacement measure leaves out tokens below it in both p and q


@dataclass(frozen=True)
class Setting:
    temperature: float
    top_p: float = 1.0

    @property
    def name(self) -> str:
        return f"T={self.temperature:g}" + (f" top-p={self.top_p:g}" if self.top_p < 1 else "")

    def sampling(self, seed: int, temperature: float | None = None) -> SamplingParams:
        temperature = self.temperature if temperature is None else temperature
        return SamplingParams(temperature=temperature, top_p=self.top_p, seed=None if temperature == 0 else seed)


def parse_settings(text: str) -> list[Setting]:
    settings = []
    for item in text.split(","):
        temperature, _, top_p = item.partition(":")
        settings.append(Setting(float(temperature), float(top_p or 1.0)))
    return settings


# -- the target's answer and the two models' distributions -------------------------------------------------------


def sampled_answer(
    pipeline: Pipeline, cache: KVCache, first_logits: torch.Tensor, start: int, tokens: int, sampling: SamplingParams
) -> tuple[list[int], torch.Tensor]:
    """Decode as plain decoding does from a cache holding the prompt (``start`` tokens) and the logits after it
    (``first_logits [V]``): the answer and the logits each token was chosen from, ``[T, V]``."""
    cache.truncate(start)
    logits = first_logits  # [V]
    answer: list[int] = []
    all_logits: list[torch.Tensor] = []
    while len(answer) < tokens:
        all_logits.append(logits)
        answer.append(int(choose_token(logits[None], sampling, None, start + len(answer))[0]))
        if answer[-1] in pipeline.eos_token_ids:
            break
        logits = pipeline.target.forward(torch.tensor([[answer[-1]]]), cache)[0, -1]
    return answer, torch.stack(all_logits)


def target_answers(
    pipeline: Pipeline, prompt: list[int], settings: dict[str, Setting], tokens: int, seed: int
) -> dict[str, list[int]]:
    """The target reads ``prompt`` once and answers it as plain decoding does under each setting (seeded with
    ``seed``; greedy at T = 0): up to ``tokens`` tokens per setting, by name."""
    cache = pipeline.target.new_cache(1)
    first = pipeline.target.forward(torch.tensor([prompt]), cache, last_only=True)[0, -1]  # [V]
    return {
        name: sampled_answer(pipeline, cache, first, len(prompt), tokens, setting.sampling(seed))[0]
        for name, setting in settings.items()
    }


def teacher_forced_logits(
    draft: Runtime, cache: KVCache, first_logits: torch.Tensor, start: int, answer: list[int]
) -> torch.Tensor:
    """The draft model's logits predicting each answer token, ``[T, V]``, from a cache holding the prompt."""
    cache.truncate(start)
    if len(answer) == 1:
        return first_logits[None]
    rest = draft.forward(torch.tensor([answer[:-1]]), cache)[0]  # [T - 1, V]
    return torch.cat([first_logits[None], rest])


def draft_probs(logits: torch.Tensor, sampling: SamplingParams, vocab_size: int) -> torch.Tensor:
    """q as the draft-model drafter forms it: processed draft logits ``[T, V_draft]`` -> ``[T, V]`` on the target's
    ids (ids the target lacks dropped and q renormalized)."""
    probs = logits_to_probs(logits, sampling)  # [T, V_draft]
    if probs.shape[-1] > vocab_size:
        probs = probs[:, :vocab_size]
        return probs / probs.sum(dim=-1, keepdim=True)
    return torch.nn.functional.pad(probs, (0, vocab_size - probs.shape[-1]))


def draft_matches(
    logits: torch.Tensor, tokens: list[int], sampling: SamplingParams, start: int, vocab_size: int
) -> list[bool]:
    """Whether the draft model's choice from each row of its teacher-forced ``logits [T, V_draft]`` is the answer's
    token there (the answer starts at sequence position ``start``): greedy, its argmax; seeded, its Gumbel-max choice
    under the position's noise (the coupled match a seeded draft is accepted by)."""
    answer = torch.tensor(tokens)  # [T]
    if sampling.is_greedy:
        return (logits[:, :vocab_size].argmax(-1) == answer).tolist()
    noise = position_noise(sampling.seed, range(start, start + len(tokens)), vocab_size)  # [T, V]
    return (gumbel_argmax(draft_probs(logits, sampling, vocab_size).log(), noise) == answer).tolist()


# -- per-position measures ------------------------------------------------------------------------------------------


def draft_rank(draft_scores: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """How many tokens the draft's seeded scores log q + g ``[T, V]`` put above the target's token ``[T]``: ``[T]``
    (0: the draft's seeded token is the target's; below k: the target's token is among the draft's seeded top k)."""
    return (draft_scores > draft_scores.gather(-1, target_tokens[:, None])).sum(dim=-1)


def iid_rejection(target: torch.Tensor, draft: torch.Tensor, k: int) -> torch.Tensor:
    """P(one of k i.i.d. drafts from q is accepted) under recursive rejection sampling, ``[T, V]`` -> ``[T, k]``."""
    residual, all_rejected, accepted = target, torch.ones(target.shape[0]), []
    for _ in range(k):
        all_rejected = all_rejected * (1 - torch.minimum(residual, draft).sum(dim=-1))  # [T]
        accepted.append(1 - all_rejected)
        residual = residual_probs(residual, draft)  # [T, V] norm(max(p_i - q, 0))
    return torch.stack(accepted, dim=-1)


def spectr_bound(target: torch.Tensor, draft: torch.Tensor, k: int) -> torch.Tensor:
    """SpecTr's upper bound on any acceptance of k i.i.d. drafts from q: Σ min(p, 1 - (1 - q)^k), ``[T]``."""
    covered = -torch.expm1(k * torch.log1p(-draft))  # [T, V] 1 - (1 - q)^k, exact for small q in float32
    return torch.minimum(target, covered).sum(dim=-1)


def without_replacement(
    target: torch.Tensor, draft: torch.Tensor, samples: int, generator: torch.Generator
) -> tuple[list[float], float]:
    """P(one of the first 1, 2, 3 drafts drawn from q without replacement is accepted) under recursive rejection
    sampling at one position (``[V]`` each); also the mass left out.

    Round i accepts draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); on a rejection p_{i+1} =
    norm(max(p_i - q_i, 0)) and q_{i+1} is q without x_1..x_i, renormalized. Round 1 is exact; the rejected first
    draft x_1 (drawn ``samples`` times from max(q - p, 0), its law given a rejection) and the rejected second draft
    x_2 given x_1 are sampled, and each round's acceptance given them is exact. Tokens where both p and q are below
    ``SUPPORT_FLOOR`` are left out (p and q renormalized without them).
    """
    keep = torch.maximum(target, draft) >= SUPPORT_FLOOR  # [V]
    dropped = max(0.0, 1 - float(target[keep].double().sum()), 1 - float(draft[keep].double().sum()))
    p, q = target[keep].double(), draft[keep].double()  # [N]
    p, q = p / p.sum(), q / q.sum()
    alpha1 = float(torch.minimum(p, q).sum())
    rejected1 = (q - p).clamp(min=0)  # [N]: P(the first draft is x and is rejected)
    mass1 = float(rejected1.sum())  # 1 - alpha1
    if mass1 <= 0:
        return [alpha1] * 3, dropped
    rows = torch.arange(samples)
    first = torch.multinomial(rejected1, samples, replacement=True, generator=generator)  # [M]
    residual2 = residual_probs(p, q)  # [N]
    draft2 = q.repeat(samples, 1)  # [M, N]
    draft2[rows, first] = 0
    left2 = draft2.sum(dim=-1, keepdim=True)  # [M, 1]: q without x_1 (summed, not 1 - q(x_1): exact near 1)
    draft2 = draft2 / left2.clamp(min=1e-300)  # all 0 where q holds x_1 only: no second draft
    alpha2 = torch.minimum(residual2[None], draft2).sum(dim=-1)  # [M]
    within2 = alpha1 + mass1 * float(alpha2.mean())
    rejected2 = (draft2 - residual2[None]).clamp(min=0)  # [M, N]: P(the second draft is x and is rejected | x_1)
    mass2 = rejected2.sum(dim=-1)  # [M]: 1 - alpha2
    weights = torch.where(mass2[:, None] > 0, rejected2, 1.0)  # rows without a rejection weigh 0 below
    second = torch.multinomial(weights, 1, generator=generator).squeeze(-1)  # [M]
    residual3 = residual_probs(residual2[None].expand_as(draft2), draft2)  # [M, N]
    draft3 = q.repeat(samples, 1)  # [M, N]
    draft3[rows, first] = 0
    draft3[rows, second] = 0
    left3 = draft3.sum(dim=-1, keepdim=True)  # [M, 1]
    alpha3 = torch.where(left3 > 0, torch.minimum(residual3, draft3 / left3.clamp(min=1e-300)), 0).sum(dim=-1)
    within3 = within2 + mass1 * float((mass2 * alpha3).mean())
    return [alpha1, within2, within3], dropped


# -- tokens per step ------------------------------------------------------------------------------------------------


def chain_tokens(accept: torch.Tensor, gamma: int, extra: torch.Tensor | None = None) -> list[float]:
    """Expected tokens of a step starting at each position, acceptances ``[T]`` taken as independent:
    Σ_{j<=γ} Π_{i<j} a_{t+i}; with ``extra`` [T] (P(a sibling is accepted where the chain's draft is not),
    unconditional) a step that stops at depth j < γ gains extra_{t+j}."""
    values = []
    for start in range(max(1, len(accept) - gamma + 1)):
        reach, expected = 1.0, 1.0
        for depth in range(min(gamma, len(accept) - start)):
            if extra is not None:
                expected += reach * float(extra[start + depth])
            reach *= float(accept[start + depth])
            expected += reach
        values.append(expected)
    return values


def replay(matches: list[bool], gamma: int, sibling: list[bool] | None = None) -> tuple[int, int]:
    """Tokens and steps of a γ-chain replayed along the answer when ``matches[t]`` says the chain's draft at t is
    the target's token (exact: the drafts after an accepted one read the answer's tokens); with ``sibling[t]`` (the
    target's token is one of the siblings at t) a step that stops there commits the sibling and the token after it.
    Counts the steps that start where :func:`chain_tokens` starts them (all γ drafts inside the answer)."""
    last_start = max(0, len(matches) - gamma)
    position, tokens, steps = 0, 0, 0
    while position <= last_start:
        accepted = 0
        while accepted < gamma and position + accepted < len(matches) and matches[position + accepted]:
            accepted += 1
        stop = position + accepted
        gained = 1 if accepted < gamma and stop < len(matches) and sibling is not None and sibling[stop] else 0
        tokens += accepted + 1 + gained
        steps += 1
        position += accepted + 1 + gained
    return tokens, steps


# -- one question, one setting --------------------------------------------------------------------------------------


def measure(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    answer: list[int],
    setting: Setting,
    noises: list[torch.Tensor],
    args: argparse.Namespace,
) -> dict[str, float]:
    """Token-pooled sums of every measure for one answer (``count`` tokens, ``starts`` chain start positions).

    ``noises``: the Gumbel noise ``[tokens, V]`` of the answer's positions under ``--seed`` (the answer's own) and
    under each of the ``--noise-seeds`` next seeds."""
    vocab_size = target_logits.shape[-1]
    tokens = torch.tensor(answer)  # [T]
    sums: dict[str, float] = defaultdict(float)
    sums["count"] = len(answer)
    if setting.temperature == 0:  # greedy: every draft is the draft model's argmax, so every measure is a rank's
        logits = draft_logits[:, :vocab_size]  # [T, V]
        rank = (logits > logits.gather(-1, tokens[:, None])).sum(dim=-1)  # [T]: draft tokens above the target's
        within = torch.stack([(rank < k).float() for k in CANDIDATES], dim=-1)  # [T, k]
        for name in ("sum_min", "coupled_on_path"):
            sums[name] = float(within[:, 0].sum())
        for k in CANDIDATES:
            for name in ("iid_k", "wor_k", "bound_k"):
                sums[f"{name}{k}"] = float(within[:, k - 1].sum())
        add_blocks(sums, within, within, rank, args.gamma)
        return dict(sums)

    sampling = setting.sampling(args.seed)
    target = logits_to_probs(target_logits, sampling)  # [T, V]
    draft = draft_probs(draft_logits, sampling, vocab_size)  # [T, V]
    on_path_noise = noises[0][: len(answer)]  # [T, V]: the noise that made the answer
    if not torch.equal(gumbel_argmax(target.log(), on_path_noise), tokens):
        print("  warning: the recomputed Gumbel tokens differ from the answer", file=sys.stderr)
    sums["sum_min"] = float(torch.minimum(target, draft).sum())
    sums["coupled_on_path"] = float((gumbel_argmax(draft.log(), on_path_noise) == tokens).sum())
    on_path_rank = draft_rank(draft.log() + on_path_noise, tokens)  # [T]

    # log p and log q once: each noise's Gumbel-max choices below are gumbel_argmax's argmax(log p + g)
    target_log = target.log()  # [T, V]
    shaped_log = {factor: draft.log() for factor in SHAPING if factor == 1}  # [T, V] each
    for factor in SHAPING:
        if factor != 1:
            shaped = setting.sampling(args.seed, factor * setting.temperature)
            shaped_log[factor] = draft_probs(draft_logits, shaped, vocab_size).log()
    for factor, draft_log in shaped_log.items():
        sums[f"shaped_sum_min_{factor:g}"] = float(torch.minimum(target, draft_log.exp()).sum())
    seeded = torch.zeros(len(answer), max(CANDIDATES))  # [T, k]: P(target's token in the draft's seeded top k)
    for noise in noises[1:]:
        noise = noise[: len(answer)]  # [T, V]
        target_tokens = argmax(target_log + noise)  # [T]
        rank = draft_rank(shaped_log[1] + noise, target_tokens)  # [T]
        for k in CANDIDATES:
            seeded[:, k - 1] += (rank < k).float() / args.noise_seeds
        for factor, draft_log in shaped_log.items():
            shaped_match = argmax(draft_log + noise) == target_tokens
            sums[f"shaped_coupled_{factor:g}"] += float(shaped_match.sum()) / args.noise_seeds

    iid = iid_rejection(target, draft, max(CANDIDATES))  # [T, k]
    wor = torch.zeros(len(answer), max(CANDIDATES))  # [T, k]
    generator = torch.Generator().manual_seed(args.seed)
    for position in range(len(answer)):
        accepted, dropped = without_replacement(target[position], draft[position], args.samples, generator)
        wor[position] = torch.tensor(accepted)
        sums["wor_dropped"] += dropped
        sums["wor_dropped_max"] = max(sums["wor_dropped_max"], dropped)
    for k in CANDIDATES:
        sums[f"iid_k{k}"] = float(iid[:, k - 1].sum())
        sums[f"wor_k{k}"] = float(wor[:, k - 1].sum())
        sums[f"bound_k{k}"] = float(spectr_bound(target, draft, k).sum())
    add_blocks(sums, wor, seeded, on_path_rank, args.gamma)
    return dict(sums)


def add_blocks(
    sums: dict[str, float], unseeded: torch.Tensor, seeded: torch.Tensor, on_path_rank: torch.Tensor, gamma: int
) -> None:
    """Tokens per step at γ: ``unseeded`` and ``seeded`` ``[T, k]`` are P(accepted within k candidates) at each
    position (column 0: one draft; seeded: averaged over the other seeds), ``on_path_rank [T]`` the draft's seeded
    rank of the answer's token under its own noise. Also sums ``coupled_avg`` and ``seeded_top{k}``."""
    sums["coupled_avg"] = float(seeded[:, 0].sum())
    on_path = on_path_rank == 0  # [T]
    chain = chain_tokens(unseeded[:, 0], gamma)
    sums["starts"] = len(chain)
    sums["chain_sum_min"] = sum(chain)
    sums["chain_coupled_avg"] = sum(chain_tokens(seeded[:, 0], gamma))
    sums["chain_on_path"] = sum(chain_tokens(on_path.float(), gamma))
    sums["replay_tokens"], sums["replay_steps"] = replay(on_path.tolist(), gamma)
    for k in CANDIDATES:
        sums[f"seeded_top{k}"] = float(seeded[:, k - 1].sum())
        if k > 1:
            extra = unseeded[:, k - 1] - unseeded[:, 0]  # [T]: a sibling accepted where the chain's draft is not
            sums[f"chain_wor_k{k}"] = sum(chain_tokens(unseeded[:, 0], gamma, extra))
            extra = seeded[:, k - 1] - seeded[:, 0]  # [T]
            sums[f"chain_top{k}"] = sum(chain_tokens(seeded[:, 0], gamma, extra))
            counted = replay(on_path.tolist(), gamma, (on_path_rank < k).tolist())
            sums[f"replay_top{k}_tokens"], sums[f"replay_top{k}_steps"] = counted


# -- tables ---------------------------------------------------------------------------------------------------------


def pooled(rows: list[dict[str, float]]) -> dict[str, float]:
    """Token-pooled means (chains: per start position; replays: tokens per step, pooled)."""
    total: dict[str, float] = defaultdict(float)
    for row in rows:
        for name, value in row.items():
            total[name] = max(total[name], value) if name.endswith("_max") else total[name] + value
    means = {}
    for name, value in total.items():
        if name.startswith("chain_"):
            means[name] = value / total["starts"]
        elif name.startswith("replay") and name.endswith("_tokens"):
            means[name.removesuffix("_tokens")] = value / total[name.replace("_tokens", "_steps")]
        elif name.endswith("_max") or name in ("count", "starts"):
            means[name] = value
        elif not name.endswith("_steps"):
            means[name] = value / total["count"]
    return means


ACCEPTANCE_COLUMNS = (
    ("sum_min", "sum_min"),
    ("on-path", "coupled_on_path"),
    ("coupled", "coupled_avg"),
    ("top2", "seeded_top2"),
    ("top3", "seeded_top3"),
    ("iid2", "iid_k2"),
    ("iid3", "iid_k3"),
    ("wor2", "wor_k2"),
    ("wor3", "wor_k3"),
    ("bound2", "bound_k2"),
    ("bound3", "bound_k3"),
)
BLOCK_COLUMNS = (
    ("sum_min", "chain_sum_min"),
    ("wor+2", "chain_wor_k2"),
    ("wor+3", "chain_wor_k3"),
    ("coupled", "chain_coupled_avg"),
    ("top+2", "chain_top2"),
    ("top+3", "chain_top3"),
    ("on-path", "chain_on_path"),
    ("replay", "replay"),
    ("replay+2", "replay_top2"),
    ("replay+3", "replay_top3"),
)


def tables(results: dict[str, list[dict]], settings: list[Setting], gamma: int) -> str:
    lines = ["# acceptance per position, token-pooled (seeded: on-path, coupled, top2, top3; unseeded: the rest)"]
    header = f"{'setting':<18} {'category':<15} {'tokens':>6} " + " ".join(f"{n:>7}" for n, _ in ACCEPTANCE_COLUMNS)
    lines.append(header)
    for setting in settings:
        rows = results[setting.name]
        categories = dict.fromkeys(row["category"] for row in rows)
        groups = {"all": rows} | {c: [row for row in rows if row["category"] == c] for c in categories}
        for category, members in groups.items():
            means = pooled([r["sums"] for r in members])
            values = " ".join(f"{means[key]:>7.3f}" for _, key in ACCEPTANCE_COLUMNS)
            lines.append(f"{setting.name:<18} {category:<15} {int(means['count']):>6} {values}")
    lines.append("")
    lines.append("# draft shaping: draft at factor x T, target at T (sum_min: unseeded; coupled: seeded, avg)")
    lines.append(f"{'setting':<18} " + " ".join(f"{'x' + format(f, 'g'):>14}" for f in SHAPING))
    for setting in (setting for setting in settings if setting.temperature > 0):
        means = pooled([r["sums"] for r in results[setting.name]])
        cells = " ".join(
            f"{means[f'shaped_sum_min_{f:g}']:>6.3f}/{means[f'shaped_coupled_{f:g}']:<7.3f}" for f in SHAPING
        )
        lines.append(f"{setting.name:<18} {cells}")
    lines.append("")
    lines.append(
        f"# tokens per step at gamma={gamma}, a chain (+k-1 siblings at every depth): from per-position acceptance "
        "taken as independent (mean over start positions; unseeded: sum_min, wor; seeded: coupled, top, on-path); "
        "replay: the seeded on-path chain replayed along the answer"
    )
    lines.append(f"{'setting':<18} " + " ".join(f"{n:>8}" for n, _ in BLOCK_COLUMNS))
    for setting in settings:
        means = pooled([r["sums"] for r in results[setting.name]])
        lines.append(f"{setting.name:<18} " + " ".join(f"{means[key]:>8.3f}" for _, key in BLOCK_COLUMNS))
    for setting in settings:
        if setting.temperature > 0:
            means = pooled([r["sums"] for r in results[setting.name]])
            lines.append(
                f"# {setting.name}: w/o-replacement support left out {means['wor_dropped']:.2e} mean, "
                f"{means['wor_dropped_max']:.2e} max"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96, help="target tokens per question (default 96)")
    parser.add_argument("--settings", default="0,0.7,1.0,0.7:0.95", help="temperature[:top_p], comma-separated")
    parser.add_argument("--seed", type=int, default=1, help="the seed of the target's answer (default 1)")
    parser.add_argument("--noise-seeds", type=int, default=8, help="other seeds for the averaged coupling")
    parser.add_argument("--gamma", type=int, default=4, help="drafts per step for tokens per step (default 4)")
    parser.add_argument("--samples", type=int, default=8, help="rejected drafts sampled per position (w/o-repl)")
    parser.add_argument("--limit", type=int, default=None, help="measure only the first N sampled questions")
    parser.add_argument("--out", type=Path, default=None, help="folder for acceptance.json and acceptance.txt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = parse_settings(args.settings)
    pipeline = Pipeline.load()  # the default pair, the draft with its default weights and vocabulary
    assert pipeline.draft is not None
    questions: list[Question] = sample_questions(load_questions(args.questions), args.per_category, 0)
    questions = questions[: args.limit]
    results: dict[str, list[dict]] = {setting.name: [] for setting in settings}
    began = time.perf_counter()
    for number, question in enumerate(questions, start=1):
        prompt = pipeline.encode(question.turns[0], chat=True)
        pipeline.draft.focus_vocabulary(prompt)  # as the draft-model drafter does for a request
        target_cache, draft_cache = pipeline.target.new_cache(1), pipeline.draft.new_cache(1)
        target_first = pipeline.target.forward(torch.tensor([prompt]), target_cache, last_only=True)[0, -1]  # [V]
        draft_first = pipeline.draft.forward(torch.tensor([prompt]), draft_cache, last_only=True)[0, -1]  # [V]
        positions = range(len(prompt), len(prompt) + args.tokens)
        noises = [  # [tokens, V] each, shared by the settings
            position_noise(args.seed + offset, positions, target_first.shape[-1])
            for offset in range(args.noise_seeds + 1)
            if any(setting.temperature > 0 for setting in settings)
        ]
        for setting in settings:
            answer, target_logits = sampled_answer(
                pipeline, target_cache, target_first, len(prompt), args.tokens, setting.sampling(args.seed)
            )
            draft_logits = teacher_forced_logits(pipeline.draft, draft_cache, draft_first, len(prompt), answer)
            sums = measure(target_logits, draft_logits, answer, setting, noises, args)
            results[setting.name].append(
                {
                    "question_id": question.question_id,
                    "category": question.category,
                    "prompt_tokens": len(prompt),
                    "sums": sums,
                }
            )
            print(
                f"[{number}/{len(questions)} {time.perf_counter() - began:.0f}s] {question.category:<14} "
                f"{setting.name:<16} tokens {len(answer):>3}  sum_min {sums['sum_min'] / len(answer):.3f}  "
                f"coupled {sums['coupled_avg'] / len(answer):.3f}",
                file=sys.stderr,
                flush=True,
            )
    report = tables(results, settings, args.gamma)
    elapsed = time.perf_counter() - began
    report += f"\n# {len(questions)} questions, {elapsed:.0f} s"
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "acceptance.txt").write_text(report + "\n")
        (args.out / "acceptance.json").write_text(
            json.dumps(
                {
                    "arguments": {k: str(v) for k, v in vars(args).items()},
                    "seconds": round(elapsed),
                    "results": results,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()

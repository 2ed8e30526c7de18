"""What the vocabulary-wide passes around a drafted token and a verify cost, before `c786127` (the expressions as they
were, written out here) and after (the library's), taking turns at going first, medians of 300 calls each:

    cd /tmp && .venv/bin/python results/xeon-167/step-overheads/vocab_passes.py

Rows are 151,936 wide (the default pair's vocabulary). A focused draft row has 49,152 finite logits (normal, σ 3),
the rest −inf, as the draft model's LM head over its focused vocabulary gives them; a target row has σ 3 logits
everywhere. Seeded rows are at T 0.7 with their noise already made (the drafter makes it), γ 3. Then torch's exp
alone over such rows and over a row of −100 (whose exponentials are subnormal), with the CPU's flush-to-zero off
and on.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from quickdraft.config import SamplingParams
from quickdraft.lossless.rules import verify_drafts
from quickdraft.lossless.sampling import any_finite, position_noise, sample, top_probability
from quickdraft.lossless.verify import accept_matching_prefix, block_judgement, block_verify, gumbel_argmax

V, FOCUS, GAMMA = 151_936, 49_152, 3
SEEDED = SamplingParams(temperature=0.7, seed=1)


def top_probability_before(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    return 1.0 / (logits - logits.amax(dim=-1, keepdim=True)).exp().sum(dim=-1)


def seeded_verify_before(draft_token_ids: torch.Tensor, target_logits: torch.Tensor, position: int) -> torch.Tensor:
    scores = (target_logits - target_logits.amax(dim=-1, keepdim=True)) / SEEDED.temperature  # [1, γ + 1, V]
    noise = position_noise(1, range(position, position + GAMMA + 1), V)  # [γ + 1, V]
    return accept_matching_prefix(draft_token_ids, gumbel_argmax(scores, noise[None])).num_accepted


def block_verify_before(draft_token_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> None:
    passes, dists = block_judgement(draft_token_ids, draft_probs, target_probs)  # [1, γ], [1, γ + 1, V]
    uniform = torch.rand(passes.shape)  # [1, γ]
    passing = torch.where(uniform < passes, torch.arange(1, GAMMA + 1), 0)  # [1, γ]
    num_accepted = passing.max(dim=1).values  # [1]
    sample(dists[torch.arange(1), num_accepted], None)


def median_ms(calls: list[tuple[str, Callable[[], object]]]) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name, _ in calls}
    for turn in range(300):
        for name, call in calls if turn % 2 == 0 else calls[::-1]:
            tick = time.perf_counter()
            call()
            times[name].append(1000 * (time.perf_counter() - tick))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(0)
    draft_row = torch.full((1, V), float("-inf"))
    draft_row[0, torch.randperm(V, generator=generator)[:FOCUS]] = 3 * torch.randn(FOCUS, generator=generator)
    target_row = 3 * torch.randn(1, V, generator=generator)
    target_logits = 3 * torch.randn(1, GAMMA + 1, V, generator=generator)  # [1, γ + 1, V]
    position = 500
    noise = position_noise(1, range(position, position + GAMMA + 1), V)  # made once: cached, as in a step
    draft_token_ids = gumbel_argmax(target_logits[:, :GAMMA] / SEEDED.temperature, noise[None, :GAMMA])  # accepted
    assert torch.equal(top_probability(draft_row), top_probability_before(draft_row))
    assert torch.equal(top_probability(target_row), top_probability_before(target_row))
    expected = seeded_verify_before(draft_token_ids, target_logits, position)
    result = verify_drafts(draft_token_ids, None, target_logits, SEEDED, generator, position)
    assert torch.equal(result.num_accepted, expected) and int(expected[0]) == GAMMA
    draft_probs = torch.softmax(target_logits[:, :GAMMA] + torch.randn(1, GAMMA, V, generator=generator), -1)
    target_probs = torch.softmax(target_logits / 0.7, -1)  # [1, γ + 1, V]
    rows = [
        (
            "top_probability, focused draft row",
            lambda: top_probability_before(draft_row),
            lambda: top_probability(draft_row),
        ),
        (
            "top_probability, target row",
            lambda: top_probability_before(target_row),
            lambda: top_probability(target_row),
        ),
        (
            "finite check, focused draft row",
            lambda: torch.isfinite(draft_row).any(),
            lambda: any_finite(draft_row).any(),
        ),
        (
            f"seeded verify, γ {GAMMA}",
            lambda: seeded_verify_before(draft_token_ids, target_logits, position),
            lambda: verify_drafts(draft_token_ids, None, target_logits, SEEDED, generator, position),
        ),
        (
            f"block verification's draw, γ {GAMMA}",
            lambda: block_verify_before(draft_token_ids, draft_probs, target_probs),
            lambda: block_verify(draft_token_ids, draft_probs, target_probs, generator),
        ),
    ]
    print("pass | before ms | after ms")
    for name, before, after in rows:
        medians = median_ms([("before", before), ("after", after)])
        print(f"{name} | {medians['before']:.3f} | {medians['after']:.3f}")
    print("torch's exp alone over a row | flush-to-zero off ms | on ms")
    for name, row in (
        ("σ 3 values", target_row),
        ("focused draft row", draft_row),
        ("all −100", torch.full((1, V), -100.0)),
    ):
        medians = {}
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            medians[flush] = median_ms([("exp", row.exp)])["exp"]
        torch.set_flush_denormal(False)
        print(f"{name} | {medians[False]:.3f} | {medians[True]:.3f}")


if __name__ == "__main__":
    main()

"""Drafting on another thread while the target runs: a drafter reads only its task (a snapshot of the committed
tokens, its own state, its own cursor in the request's grammar) and every native kernel releases the GIL, so the
two may overlap, and each still gets exactly the bits it gets alone."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from conftest import draft_task, native_pipeline

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import DraftProposal
from quickdraft.drafters.draft_model import DraftModelDrafter

VOCAB = 48


@pytest.mark.parametrize("seed", range(6))
def test_a_draft_on_a_thread_beside_a_target_forward_gets_the_bits_of_each_alone(seed: int) -> None:
    pipeline = native_pipeline(VOCAB)
    assert pipeline.draft is not None
    rng = random.Random(seed)
    context = [rng.randrange(VOCAB) for _ in range(rng.randrange(4, 40))]
    block = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 9))]  # a verify block after the context
    # greedy, seeded and unseeded (the one rule whose drafts keep their distributions) in turn
    sampling = [SamplingParams(), SamplingParams(temperature=0.8, seed=seed), SamplingParams(temperature=0.8)][seed % 3]

    def draft() -> DraftProposal:
        drafter = DraftModelDrafter(pipeline.draft, pipeline.target.vocab_size)  # type: ignore[arg-type]
        state = drafter.start(context, target_cache=None)  # type: ignore[arg-type]
        task = draft_task(state, context, 5, sampling, torch.Generator().manual_seed(seed))
        return drafter.propose([task])[0]

    def verify() -> torch.Tensor:
        cache = pipeline.target.new_cache(1)
        pipeline.target.forward(torch.tensor([context]), cache)
        return pipeline.target.forward(torch.tensor([block]), cache)  # [1, k, V]

    alone_draft, alone_logits = draft(), verify()
    for _ in range(3):  # either side may start first, by a random delay
        drafted: list[DraftProposal] = []

        def on_a_thread(drafted: list[DraftProposal] = drafted, delay: float = rng.random() * 0.004) -> None:
            time.sleep(delay)
            drafted.append(draft())

        thread = threading.Thread(target=on_a_thread)
        thread.start()
        time.sleep(rng.random() * 0.004)
        logits = verify()
        thread.join()
        assert torch.equal(logits, alone_logits)
        assert torch.equal(drafted[0].token_ids, alone_draft.token_ids)
        if sampling.is_unseeded:
            assert drafted[0].probs is not None and alone_draft.probs is not None
            assert torch.equal(drafted[0].probs, alone_draft.probs)

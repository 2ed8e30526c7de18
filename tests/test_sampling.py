from __future__ import annotations

import pytest
import torch

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.errors import ConfigError
from quickdraft.sampling import logits_to_probs, make_generator, sample

LOGITS = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))


def test_greedy_is_one_hot_argmax() -> None:
    assert logits_to_probs(LOGITS, SamplingParams()).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_temperature_one_keeps_the_distribution() -> None:
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0))
    assert torch.allclose(probs, torch.tensor([[0.1, 0.4, 0.2, 0.3]]))


def test_top_k_keeps_the_k_likeliest() -> None:
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(probs, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


@pytest.mark.parametrize(
    ("top_p", "kept"), [(0.4, [1]), (0.5, [1, 3]), (0.7, [1, 3]), (0.75, [1, 3, 2]), (1.0, [0, 1, 2, 3])]
)
def test_top_p_keeps_smallest_prefix_reaching_the_mass(top_p: float, kept: list[int]) -> None:
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))[0]
    assert sorted(torch.nonzero(probs).flatten().tolist()) == sorted(kept)
    assert torch.isclose(probs.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-40, 1e-6])
@pytest.mark.parametrize("filters", [{}, {"top_k": 2}, {"top_p": 0.5}])
def test_a_tiny_temperature_concentrates_on_the_argmax(temperature: float, filters: dict) -> None:
    assert logits_to_probs(LOGITS, SamplingParams(temperature=temperature, **filters)).tolist() == [[0, 1, 0, 0]]


def test_seeded_generator_reproduces_samples() -> None:
    probs = torch.full((1, 50), 1 / 50)
    first = [int(sample(probs, make_generator(7))) for _ in range(3)]
    assert first == [int(sample(probs, make_generator(7))) for _ in range(3)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_bad_sampling_params(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"num_draft_tokens": -1}, "num_draft_tokens"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_bad_generation_config(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(**kwargs)


def test_seeds_span_64_bits() -> None:
    assert SamplingParams(seed=0).seed == 0 and SamplingParams(seed=2**64 - 1).seed == 2**64 - 1

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from conftest import chi_square_pvalue
from scipy.stats import chisquare, kstest

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.errors import ConfigError
from quickdraft.grammar import GrammarKind, GrammarSpec
from quickdraft.lossless.sampling import (
    EXP_FLOOR,
    add_position_noise_,
    any_finite,
    argmax,
    choose_tokens,
    draw,
    gumbel_argmax,
    logits_to_probs,
    logits_to_scores,
    make_generator,
    position_noise,
    sample,
    seeded_gumbel,
    top_probability,
)

LOGITS = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))


def test_greedy_is_one_hot_argmax() -> None:
    assert logits_to_probs(LOGITS, SamplingParams()).tolist() == [[0.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_is_torchs_first_maximum(dtype: torch.dtype) -> None:
    values = torch.randn(3, 4, 1000, generator=torch.Generator().manual_seed(0)).to(dtype)  # [B, K, V]
    values[0, 0, [7, 9]] = 50.0  # a tie: the first wins
    values[1, 2, 5] = float("nan")  # NaN counts as the largest, as in torch
    values[2, 1] = float("-inf")  # a row of -inf: index 0
    values[2, 3, :500] = float("-inf")
    for view in (values, values[:, 1:3], values[1], values[0, 0], values.transpose(0, 1)):
        assert torch.equal(argmax(view), view.argmax(dim=-1))
        assert argmax(view).dtype == torch.int64
    assert argmax(values)[0, 0] == 7


def test_top_probability_is_the_softmaxs_largest_entry() -> None:
    logits = 5 * torch.randn(2, 3, 1000, generator=torch.Generator().manual_seed(1))  # [B, K, V]
    logits[0, 0, 3] = float("-inf")
    expected = torch.softmax(logits, dim=-1).amax(dim=-1)
    torch.testing.assert_close(top_probability(logits), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(top_probability(LOGITS), torch.tensor([0.4]))


def test_top_probability_floors_gaps_without_changing_the_value() -> None:
    """A focused draft's row (mostly −inf) and gaps past the floor give the unfloored value; a row of −inf gives NaN,
    as the softmax does."""
    generator = torch.Generator().manual_seed(2)
    logits = 4 * torch.randn(3, 50_000, generator=generator, dtype=torch.float32)  # [B, V]
    logits[0, 10_000:] = float("-inf")  # a focused vocabulary
    best = logits[1, 20_000:].amax()
    logits[1, :20_000] = best - 103 + 16 * torch.rand(20_000, generator=generator)  # gaps in (−103, −87)
    logits[2, ::7] = -1e30
    gaps = logits - logits.amax(dim=-1, keepdim=True)  # [B, V]
    subnormal = (gaps.exp() > 0) & (gaps.exp() < torch.finfo(torch.float32).tiny)
    assert subnormal[1].sum() > 10_000 and (gaps[1] < EXP_FLOOR).sum() > 10_000  # the floor's case, many times
    unfloored = 1.0 / gaps.exp().sum(dim=-1)
    assert torch.equal(top_probability(logits), unfloored)
    torch.testing.assert_close(top_probability(logits), torch.softmax(logits.double(), -1).amax(-1).float())
    assert top_probability(torch.full((1, 8), float("-inf"))).isnan().all()


def test_any_finite_is_torchs() -> None:
    values = torch.randn(5, 300, generator=torch.Generator().manual_seed(3))  # [B, V]
    values[1] = float("-inf")
    values[2] = float("nan")
    values[3, :-1] = float("inf")
    values[4, 1:] = float("-inf")
    for view in (values, values.double(), values[:, :100], values[1:3], values.T.contiguous().T):
        assert torch.equal(any_finite(view), torch.isfinite(view).any(dim=-1))
    assert any_finite(values.bfloat16()).tolist() == [True, False, False, True, True]  # torch's own pass


def test_position_noise_added_in_place_has_the_bits_of_the_sum() -> None:
    scores = torch.randn(4, 3000, generator=torch.Generator().manual_seed(4))  # [K, V]
    expected = scores + position_noise(11, range(40, 44), 3000)
    assert add_position_noise_(scores, 11, 40) is scores
    assert torch.equal(scores, expected)


def test_temperature_one_keeps_the_distribution() -> None:
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0))
    assert torch.allclose(probs, torch.tensor([[0.1, 0.4, 0.2, 0.3]]))


def test_top_k_keeps_the_k_likeliest() -> None:
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(probs, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


@pytest.mark.parametrize(
    ("top_p", "kept"), [(0.0, [1]), (0.4, [1]), (0.5, [1, 3]), (0.7, [1, 3]), (0.75, [1, 3, 2]), (1.0, [0, 1, 2, 3])]
)
def test_top_p_keeps_smallest_prefix_reaching_the_mass(top_p: float, kept: list[int]) -> None:
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))[0]
    assert sorted(torch.nonzero(probs).flatten().tolist()) == sorted(kept)
    assert torch.isclose(probs.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324])
def test_a_top_p_that_rounds_to_zero_in_float32_keeps_the_top_token(top_p: float) -> None:
    """float32 reads such a top_p as 0, and 0 >= 0 dropped every token: sampling drew an id past the vocabulary."""
    params = SamplingParams(temperature=1.0, top_p=top_p)
    assert logits_to_probs(LOGITS, params).tolist() == [[0, 1, 0, 0]]
    assert choose_tokens(logits_to_scores(LOGITS, params), params, torch.Generator().manual_seed(0), 0).tolist() == [1]


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-40, 1e-6])
@pytest.mark.parametrize("filters", [{}, {"top_k": 2}, {"top_p": 0.5}])
def test_a_tiny_temperature_concentrates_on_the_argmax(temperature: float, filters: dict) -> None:
    assert logits_to_probs(LOGITS, SamplingParams(temperature=temperature, **filters)).tolist() == [[0, 1, 0, 0]]


@pytest.mark.parametrize(
    "settings", [{"temperature": 0.7}, {"temperature": 1.3, "top_k": 3}, {"temperature": 0.7, "top_p": 0.8}]
)
def test_scores_are_the_log_probabilities_up_to_a_constant(settings: dict) -> None:
    """Seeded choices use the scores (Gumbel-max needs no softmax): their softmax is the distribution sampled, and
    a filtered token scores -inf."""
    params = SamplingParams(**settings)
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 4
    scores, probs = logits_to_scores(logits, params), logits_to_probs(logits, params)
    assert torch.allclose(scores.softmax(dim=-1), probs, atol=1e-6)
    assert torch.equal(torch.isinf(scores), probs == 0)
    assert torch.equal(logits_to_scores(logits, SamplingParams()), logits)  # greedy: the logits, argmax'd


def test_position_noise_depends_on_seed_position_and_purpose_only() -> None:
    noise = seeded_gumbel(7, 12, 50)  # [V]
    assert noise.shape == (50,) and torch.isfinite(noise).all()
    assert torch.equal(seeded_gumbel.__wrapped__(7, 12, 50), noise)  # computed again, not from the cache
    others = [(8, 12), (7, 13), (7 + 2**32, 12), (7 + 2**63, 12)]  # seeds beyond 32 bits count too
    assert not any(torch.equal(seeded_gumbel(seed, position, 50), noise) for seed, position in others)
    assert not torch.equal(seeded_gumbel(7, 12, 50, purpose="other"), noise)
    assert torch.equal(position_noise(7, range(11, 14), 50)[1], noise)  # [3, V]


def test_position_noise_has_the_bits_of_its_formula() -> None:
    """Computed in place, the noise keeps the bits of −log(−log1p(−u)) on the position's uniforms: seeded text does
    not change with how the noise is computed."""
    for seed, position in [(1, 0), (7, 300), (2**64 - 1, 4096)]:
        key = hashlib.blake2b(f"token:{seed}:{position}".encode(), digest_size=16).digest()
        uniform = np.random.default_rng(int.from_bytes(key, "little")).random(151_936)  # [V]
        clamped = torch.from_numpy(uniform).float().clamp(min=2.0**-64, max=1.0 - 2.0**-24)
        assert torch.equal(seeded_gumbel.__wrapped__(seed, position, 151_936), -torch.log(-torch.log1p(-clamped)))


def test_position_noise_is_gumbel_distributed() -> None:
    assert kstest(seeded_gumbel(1, 0, 100_000).numpy(), "gumbel_r").pvalue > 1e-3


def test_gumbel_max_draws_from_the_distribution() -> None:
    """argmax(log p + g) over positions' noise: the counts follow p (χ²); p = 0 is never drawn."""
    probs = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.0, 0.30], dtype=torch.float64)
    tokens = gumbel_argmax(probs.log() + 3.0, position_noise(3, range(20_000), 6))  # [20_000]; any constant
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[4] == 0
    keep = probs > 0
    assert chisquare(counts[keep], 20_000 * probs[keep]).pvalue > 1e-3


def test_choose_tokens_by_rule() -> None:
    """Greedy: the argmax; seeded: the position's Gumbel-max choice, whatever the generator; else the generator's."""
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]] * 2).log()  # [B, V] scores
    assert choose_tokens(probs, SamplingParams(), None, position=5).tolist() == [3, 3]
    seeded = SamplingParams(temperature=1.0, seed=9)
    expected = gumbel_argmax(probs, seeded_gumbel(9, 5, 4))
    for generator in (None, make_generator(0), make_generator(1)):
        assert torch.equal(choose_tokens(probs, seeded, generator, position=5), expected)
    unseeded = SamplingParams(temperature=1.0)
    first = choose_tokens(probs, unseeded, make_generator(2), position=5)
    assert torch.equal(choose_tokens(probs, unseeded, make_generator(2), position=6), first)
    # draw gives the distribution a token was drawn from only where verification reads it: unseeded sampling
    assert draw(probs, SamplingParams(), None, 5)[1] is None and draw(probs, seeded, None, 5)[1] is None
    tokens, drawn_from = draw(probs, unseeded, make_generator(2), position=5)
    assert torch.equal(tokens, first) and drawn_from is not None
    torch.testing.assert_close(drawn_from, probs.softmax(dim=-1))


def test_sample_draws_each_row_from_its_weights() -> None:
    rows = 200_000
    weights = torch.tensor([0.0, 3.0, 1.0, 0.0, 2.0, 0.5, 0.0])  # not normalised, zeros inside and at the end
    drawn = sample(weights.expand(rows, -1), make_generator(3))  # [rows]
    counts = torch.bincount(drawn, minlength=len(weights)).double()
    assert counts[weights == 0].sum() == 0
    probs = weights / weights.sum()
    assert chi_square_pvalue(counts, probs) > 1e-3
    # the negative control: the same counts against a slightly different distribution
    assert chi_square_pvalue(counts, torch.tensor([0.0, 0.46, 0.16, 0.0, 0.30, 0.08, 0.0])) < 1e-3
    # weights far below the total's rounding: token 1 may never show, token 2 (weight 0) never does
    tiny = sample(torch.tensor([[1.0, 1e-30, 0.0]]).expand(1000, -1), make_generator(4))
    assert set(tiny.tolist()) <= {0, 1}


def test_seeded_generator_reproduces_samples() -> None:
    probs = torch.full((1, 50), 1 / 50)
    first = [int(sample(probs, make_generator(7))) for _ in range(3)]
    assert first == [int(sample(probs, make_generator(7))) for _ in range(3)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": -0.01}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"top_k": True}, "top_k"),
        ({"temperature": True}, "temperature"),
        ({"top_p": True}, "top_p"),
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
        ({"stop": None}, "stop must be a string or a tuple"),
        ({"stop": 5}, "stop must be a string or a tuple"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"num_draft_tokens": True}, "num_draft_tokens"),
        ({"num_draft_tokens": 10**6}, "num_draft_tokens must be an integer in"),
        ({"max_draft_tokens": True}, "max_draft_tokens"),
        ({"sampling": {"temperature": 1.0}}, "sampling must be a SamplingParams"),
        ({"min_tokens": 300}, "min_tokens must be an integer in"),
        ({"min_tokens": -1}, "min_tokens must be an integer in"),
        ({"ignore_eos": 1}, "ignore_eos must be true or false"),
        ({"stop_token_ids": 7}, "stop_token_ids must be a list of token ids"),
        ({"stop_token_ids": (1, True)}, "stop_token_ids must be a list of token ids"),
        ({"ignore_eos": True, "grammar": GrammarSpec(GrammarKind.JSON)}, "ignore_eos cannot go with one"),
    ],
)
def test_bad_generation_config(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(**kwargs)


def test_a_stop_string_is_one_stop_string_not_one_per_character() -> None:
    assert GenerationConfig(stop="Hi").stop == ("Hi",)
    assert GenerationConfig(stop=["a", "bc"]).stop == ("a", "bc")  # a list is kept, as a tuple: hashable
    assert hash(GenerationConfig(stop=["a"])) == hash(GenerationConfig(stop=("a",)))
    assert GenerationConfig(kept_special_tokens=["<a>"]) == GenerationConfig(kept_special_tokens=("<a>",))
    for bad in ("<a>", [""], [5]):  # text is not one token's name per character
        with pytest.raises(ConfigError, match="kept_special_tokens must be a list of token texts"):
            GenerationConfig(kept_special_tokens=bad)
    assert GenerationConfig(stop="é🙂").stop == ("é🙂",)
    for never_written in ("\udcff", "a\ud800"):  # an undecodable argument's byte, a lone surrogate: never matched
        with pytest.raises(ConfigError, match="stop strings must be UTF-8 text") as error:
            GenerationConfig(stop=never_written)
        assert error.value.setting == "stop"


def test_seeds_span_64_bits() -> None:
    assert SamplingParams(seed=0).seed == 0 and SamplingParams(seed=2**64 - 1).seed == 2**64 - 1

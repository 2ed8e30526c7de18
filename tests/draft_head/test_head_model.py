"""The draft head's unrolled training forward against drafting one row at a time (the oracle)."""

from __future__ import annotations

import pytest
import torch

from quickdraft.draft_head.model import DraftHead, HeadCache, HeadConfig
from quickdraft.errors import ConfigError

VOCAB, HIDDEN = 40, 16


def random_head(seed: int = 0) -> DraftHead:
    config = HeadConfig(
        hidden_size=HIDDEN, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=24, num_features=3,
        vocabulary_size=20, target_vocab_size=VOCAB,
    )  # fmt: skip
    torch.manual_seed(seed)
    vocabulary = torch.arange(0, VOCAB, 2)
    head = DraftHead(config, vocabulary, torch.randn(20, HIDDEN))
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return head.eval()


def draft_like_inference(
    head: DraftHead, features: torch.Tensor, next_embeds: torch.Tensor, base: int, steps: int
) -> list[torch.Tensor]:
    """Logits of drafting from position ``base``: read positions 0..base with the target's features, then each
    further row reads the previous output and the (teacher-forced) next token's embedding."""
    cache = HeadCache(head.config)
    hidden = head.fuse(features[None, : base + 1])  # [1, base + 1, H]
    output = head.decode(next_embeds[None, : base + 1], hidden, cache)[:, -1:]
    logits = [head.logits(output)[0, 0]]
    for step in range(1, steps):
        output = head.decode(next_embeds[None, base + step : base + step + 1], output, cache)
        logits.append(head.logits(output)[0, 0])
    return logits


def test_unrolled_training_forward_is_drafting_step_by_step() -> None:
    head = random_head()
    length, steps = 9, 3
    torch.manual_seed(1)
    features = torch.randn(length, 3 * HIDDEN)
    next_embeds = torch.randn(length, HIDDEN)
    with torch.no_grad():
        trained = head.train_forward(features[None], next_embeds[None], torch.ones(1, length, dtype=torch.bool), steps)
    for base in range(length - steps + 1):
        expected = draft_like_inference(head, features, next_embeds, base, steps)
        for step in range(steps):
            torch.testing.assert_close(trained[step][0, base + step], expected[step], rtol=1e-4, atol=1e-4)


def test_padding_does_not_change_a_sequence() -> None:
    head = random_head()
    torch.manual_seed(2)
    features = torch.randn(2, 7, 3 * HIDDEN)
    next_embeds = torch.randn(2, 7, HIDDEN)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[1, 4:] = False
    with torch.no_grad():
        batched = head.train_forward(features, next_embeds, valid, 2)
        alone = head.train_forward(features[1:, :4], next_embeds[1:, :4], valid[1:, :4], 2)
    for step in range(2):
        torch.testing.assert_close(batched[step][1, step:4], alone[step][0, step:4], rtol=1e-4, atol=1e-4)
        assert torch.isfinite(batched[step]).all()


def test_unrolled_steps_train_without_nans() -> None:
    head = random_head().train()
    features = torch.randn(1, 5, 3 * HIDDEN)
    logits = head.train_forward(features, torch.randn(1, 5, HIDDEN), torch.ones(1, 5, dtype=torch.bool), 3)
    sum(step_logits.sum() for step_logits in logits).backward()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)


def test_head_cache_truncates_and_grows() -> None:
    head = random_head()
    cache = HeadCache(head.config)
    head.decode(torch.randn(1, 300, HIDDEN), torch.randn(1, 300, HIDDEN), cache)
    assert cache.length == 300
    cache.truncate(10)
    assert cache.length == 10
    with pytest.raises(ValueError):
        cache.truncate(11)


def test_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="multiple"):
        HeadConfig(16, 3, 2, 8, 24, 3, 20, 40)
    with pytest.raises(ConfigError, match="vocabulary"):
        HeadConfig(16, 4, 2, 8, 24, 3, 50, 40)


def test_the_native_head_drafts_nearly_as_the_float_one() -> None:
    from quickdraft.draft_head.native import to_native

    head = random_head()
    torch.manual_seed(3)
    embeds, hidden = torch.randn(1, 6, HIDDEN), torch.randn(1, 6, HIDDEN)
    expected = head.logits(head.decode(embeds, hidden, HeadCache(head.config)))
    native = to_native(random_head())
    got = native.logits(native.decode(embeds, hidden, HeadCache(native.config)))
    assert torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0) > 0.99

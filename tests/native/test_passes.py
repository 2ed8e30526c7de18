"""A long run of rows goes through the layers in passes (DecoderConfig.rows_per_pass): the logits, hidden states,
captured features and cached keys and values have the bits of one pass, on the compiled kernels and on the PyTorch
reference path, for a lone prompt and for requests side by side."""

from __future__ import annotations

import pytest
import torch
from conftest import native_from_hf, tiny_model

from quickdraft.runtime.native import config as config_module
from quickdraft.runtime.native.model import Decoder

PROMPT = [(7 * i + 3) % 61 for i in range(53)]  # 53 rows: passes of 16 end with a short one
OTHER = [(5 * i + 1) % 61 for i in range(21)]


@pytest.fixture(params=[True, False], ids=["kernels", "reference"])
def decoder(request: pytest.FixtureRequest) -> Decoder:
    decoder = native_from_hf(tiny_model(64, seed=5), capacity=96).decoder
    decoder.use_kernel = request.param
    return decoder


def one_pass_and_passes(monkeypatch: pytest.MonkeyPatch, decoder: Decoder, run):  # -> (run's result) x 2
    monkeypatch.setattr(config_module, "PASS_ACTIVATION_BYTES", 2**40)
    whole = run()
    monkeypatch.setattr(config_module, "PASS_ACTIVATION_BYTES", 1)
    monkeypatch.setattr(config_module, "MIN_ROWS_PER_PASS", 16)
    assert decoder.config.rows_per_pass == 16
    return whole, run()


def by_position(keys: torch.Tensor) -> torch.Tensor:
    """Cached keys ``[layers, B, kv_heads, C/16, D, 16]`` -> ``[layers, B, kv_heads, C, D]``."""
    return keys.transpose(-2, -1).flatten(3, 4)


def test_a_prompt_in_passes_has_the_bits_of_one_pass(monkeypatch: pytest.MonkeyPatch, decoder: Decoder) -> None:
    def run():  # -> logits [53, V], cache
        cache = decoder.new_cache(1)
        logits = decoder.forward(torch.tensor([PROMPT]), cache)[0]
        return logits, cache

    (whole_logits, whole_cache), (logits, cache) = one_pass_and_passes(monkeypatch, decoder, run)
    assert torch.equal(logits, whole_logits)
    assert torch.equal(cache.lengths, whole_cache.lengths)
    written = len(PROMPT)
    assert torch.equal(cache.values[:, :, :, :written], whole_cache.values[:, :, :, :written])
    assert torch.equal(by_position(cache.keys)[..., :written, :], by_position(whole_cache.keys)[..., :written, :])
    step = decoder.forward(torch.tensor([[9]]), cache)  # decoding goes on from the same cache
    assert torch.equal(step, decoder.forward(torch.tensor([[9]]), whole_cache))


def test_requests_side_by_side_in_passes_have_the_bits_of_one_pass(
    monkeypatch: pytest.MonkeyPatch, decoder: Decoder
) -> None:
    def run():  # -> forward_rows' logits, hidden states and features
        caches = [decoder.new_cache(1), decoder.new_cache(1)]
        decoder.forward(torch.tensor([OTHER[:4]]), caches[1])
        return decoder.forward_rows([(caches[0], PROMPT, True), (caches[1], OTHER[4:], False)], capture=[1])

    whole, passes = one_pass_and_passes(monkeypatch, decoder, run)
    for expected, got in zip(whole, passes, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))

"""Decoder.forward_tree: a tree's chain rows have the bits of the chain alone, each leaf the bits of a chain holding
its token at its depth, and an accepted leaf moved into its place continues as that chain would; on the compiled
kernels and on the PyTorch reference path."""

from __future__ import annotations

import pytest
import torch
from conftest import native_from_hf, tiny_model

from quickdraft.runtime.native.model import Decoder

PROMPT = [5, 9, 2, 33, 17, 4, 40, 8, 21, 3, 11, 30, 6, 14, 27, 1, 19]  # 17 tokens: the block crosses a key block
CHAIN = [12, 7, 25, 44]
LEAVES = [(2, 31), (1, 50), (4, 13), (3, 7)]  # (depth, token): siblings, a child of the chain's last, a repeat


@pytest.fixture(params=[True, False], ids=["kernels", "reference"])
def decoder(request: pytest.FixtureRequest) -> Decoder:
    decoder = native_from_hf(tiny_model(64, seed=3), capacity=64).decoder
    decoder.use_kernel = request.param
    return decoder


def prompted(decoder: Decoder, tokens: list[int]):  # -> StaticKVCache holding PROMPT + tokens
    cache = decoder.new_cache(1)
    decoder.forward(torch.tensor([PROMPT + tokens]), cache)
    return cache


def test_tree_rows_have_the_bits_of_their_chains(decoder: Decoder) -> None:
    tree_cache = prompted(decoder, [])
    start = int(tree_cache.lengths[0])
    depths = [*range(len(CHAIN)), *(depth for depth, _ in LEAVES)]
    logits = decoder.forward_tree(tree_cache, CHAIN + [token for _, token in LEAVES], depths)  # [K, V]
    assert int(tree_cache.lengths[0]) == start + len(CHAIN)
    chain_cache = prompted(decoder, [])
    assert torch.equal(logits[: len(CHAIN)], decoder.forward(torch.tensor([CHAIN]), chain_cache)[0])
    for row, (depth, token) in enumerate(LEAVES, start=len(CHAIN)):
        alone = prompted(decoder, CHAIN[: depth - 1])  # the leaf's parent is chain token depth - 1
        expected = decoder.forward(torch.tensor([[CHAIN[depth - 1], token]]), alone)[0, -1]
        assert torch.equal(logits[row], expected), (depth, token)


def test_an_accepted_leaf_moved_into_place_continues_as_its_chain(decoder: Decoder) -> None:
    cache = prompted(decoder, [])
    start = int(cache.lengths[0])
    decoder.forward_tree(cache, [*CHAIN, 31, 50], [0, 1, 2, 3, 2, 1])
    cache.move(0, start + 4, start + 2)  # leaf 31 at depth 2 accepted: it follows chain tokens 0 and 1
    cache.lengths[0] = start + 3
    step = decoder.forward(torch.tensor([[22, 9]]), cache)[0]
    expected = decoder.forward(torch.tensor([[22, 9]]), prompted(decoder, [*CHAIN[:2], 31]))[0]
    assert torch.equal(step, expected)


def test_a_tree_that_is_not_a_chain_with_leaves_is_refused(decoder: Decoder) -> None:
    cache = prompted(decoder, [])
    for tokens, depths in (([1, 2], [1, 2]), ([1, 2, 3], [0, 1, 0]), ([1, 2, 3], [0, 1, 3]), ([1], [0, 1])):
        with pytest.raises(ValueError):
            decoder.forward_tree(cache, tokens, depths)
    assert int(cache.lengths[0]) == len(PROMPT)

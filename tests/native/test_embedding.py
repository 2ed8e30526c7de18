"""The input embedding kept as a block format's affine rows: every lookup equals the float table's rows, bit for bit."""

from __future__ import annotations

import pytest
import torch

from quickdraft.runtime.native.embedding import TokenEmbedding
from quickdraft.runtime.native.formats import BLOCK_PARTS
from quickdraft.runtime.native.parts import BlockPart


@pytest.mark.parametrize("kind", sorted(BLOCK_PARTS))
def test_looked_up_rows_are_the_parts_dequantized_rows(kind: str) -> None:
    weight = torch.randn(40, 512, generator=torch.Generator().manual_seed(0))
    part = BLOCK_PARTS[kind].from_float(weight)
    assert isinstance(part, BlockPart)
    embedding = TokenEmbedding.from_blocks(kind, part.blocks())
    table = part.dequantize()  # [40, 512]
    token_ids = torch.tensor([7, 3, 3, 39, 0])  # any order, repeats
    assert torch.equal(embedding(token_ids), table[token_ids])
    assert torch.equal(embedding.table(), table)
    again = TokenEmbedding.from_state("embedding", embedding.state("embedding"))
    assert again.affine is not None and torch.equal(again(token_ids), table[token_ids])
    assert embedding.affine is not None and embedding.affine.values.dtype == torch.int8  # a byte a weight, not four


def test_float_rows_are_kept_as_they_are() -> None:
    floats = torch.randn(10, 8)
    embedding = TokenEmbedding(floats)
    assert embedding.state("embedding").keys() == {"embedding"}
    again = TokenEmbedding.from_state("embedding", {"embedding": floats})
    assert torch.equal(again(torch.tensor([2, 2])), floats[[2, 2]])


def test_an_embedding_is_one_of_the_two_forms() -> None:
    with pytest.raises(ValueError, match="one of the two"):
        TokenEmbedding()
    with pytest.raises(ValueError, match="no plain block fields"):
        TokenEmbedding.from_blocks("int8", (torch.zeros(16, 4, dtype=torch.int8),))
    with pytest.raises(KeyError):
        TokenEmbedding.from_state("embedding", {})

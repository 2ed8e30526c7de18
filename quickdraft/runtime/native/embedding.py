"""The native runtime's input embedding: token ids -> their rows ``[R, H]`` float32.

Rows are kept as floats, or, for a GGUF file's embedding of a type a block part reads exactly (``gguf_exact``), as
that part's :class:`Affine` form: int8 values and a float32 scale (and offset) per group, a quarter of the floats'
bytes or less. A lookup expands only the rows asked for, by the same arithmetic as the part's ``dequantize``, so a
row's bits are those of the float table either way.
"""

from __future__ import annotations

import torch

from quickdraft.runtime.native.formats import BLOCK_PARTS
from quickdraft.runtime.native.parts import Affine

AFFINE_TENSORS = ("values", "scale", "offset")  # an affine embedding's tensors in the weight cache


class TokenEmbedding:
    """The embedding ``[V, H]``: ``floats``, or ``affine`` rows expanded when looked up (exactly one is set)."""

    def __init__(self, floats: torch.Tensor | None = None, affine: Affine | None = None) -> None:
        if (floats is None) == (affine is None):
            raise ValueError("an embedding holds float rows or affine rows, one of the two")
        self.floats = floats  # [V, H] float32
        self.affine = affine  # values [V, G, S] int8, scale and offset [V, G]
        self.rows = len(floats) if floats is not None else len(affine.values)  # type: ignore[union-attr]

    @classmethod
    def from_blocks(cls, kind: str, fields: tuple[torch.Tensor, ...]) -> TokenEmbedding:
        """A block format's plain fields (``gguf_blocks.ExactWeight``) as affine rows."""
        if kind not in BLOCK_PARTS:
            raise ValueError(f"{kind} parts have no plain block fields")
        return cls(affine=BLOCK_PARTS[kind].affine(*fields))

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``token_ids [R]`` -> ``[R, H]`` float32 (a new tensor)."""
        if self.floats is not None:
            return self.floats[token_ids]
        assert self.affine is not None
        return self.affine.select(token_ids).dequantize()

    def table(self) -> torch.Tensor:
        """Every row, ``[V, H]`` float32 (a tied LM head quantized from the embedding reads it)."""
        return self(torch.arange(self.rows))

    def state(self, name: str) -> dict[str, torch.Tensor]:
        """Tensors for the native weight cache: ``NAME`` for float rows, else ``NAME.values``, ``NAME.scale`` (and
        ``NAME.offset``)."""
        if self.floats is not None:
            return {name: self.floats}
        assert self.affine is not None
        return {f"{name}.{key}": tensor for key, tensor in self.affine._asdict().items() if tensor is not None}

    @classmethod
    def from_state(cls, name: str, state: dict[str, torch.Tensor]) -> TokenEmbedding:
        if name in state:
            return cls(floats=state[name])
        values, scale, offset = (state.get(f"{name}.{key}") for key in AFFINE_TENSORS)
        if values is None or scale is None:
            raise KeyError(name)
        return cls(affine=Affine(values, scale, offset))

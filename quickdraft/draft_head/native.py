"""The draft head on the native runtime's integer kernels: its linear layers and its LM head as
:class:`QuantizedLinear` (7-bit weights per output channel, 8-bit activations per row, exact integer GEMMs), the
norms, RoPE and its one-layer attention in PyTorch. Drafting reads a quarter of the bytes float32 weights take."""

from __future__ import annotations

import torch
from torch import nn

from quickdraft.draft_head.model import DraftHead
from quickdraft.runtime.native.linear import QuantizedLinear

LINEARS = ("fc", "q", "k", "v", "o", "gate", "up", "down")


class NativeLinear(nn.Module):
    """``y = x @ W.T`` on the integer kernels; float in, float out, any leading shape."""

    def __init__(self, weight: torch.Tensor, kind: str = "int8") -> None:
        super().__init__()
        self.linear = QuantizedLinear.from_float(weight.detach().float(), kind=kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.float())


def to_native(head: DraftHead) -> DraftHead:
    """Swap ``head``'s linear layers and LM head for integer ones, in place (for drafting, not training)."""
    for name in LINEARS:
        setattr(head, name, NativeLinear(getattr(head, name).weight))
    head.native_lm_head = NativeLinear(head.lm_head)
    return head

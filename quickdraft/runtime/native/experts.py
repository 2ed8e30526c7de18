"""A layer's mixture of experts (``architecture.SparseMlp``), row by row like every other step of the layers.

Rules, each keeping a row's bits independent of the other rows of the call:
- **Routing** reads the row's normed float input (not its 8-bit form: the choice of experts is where a small error
  would change the most) against the router's float32 weights: one logit per expert, a dot product of fixed order;
  then the softmax over the experts, the ``top_k`` largest probabilities (ties to the lower expert number), and,
  where the family renormalizes, those over their sum (added in rank order).
- **Each expert** is a gated MLP of :class:`QuantizedLinear` layers over the rows routed to it, gathered in row order:
  their GEMMs are row-exact, so a row's output is the same whichever rows share the expert.
- **The output** of a row starts at zero and adds weight × expert output for its experts in ascending expert
  number, one multiply and one add each.
- **A shared expert** (where the family has one) takes every row after the routed experts, weighted by the sigmoid
  of the row's dot product with its float32 gate (a fixed order, as the router's).
The compiled path (``layers.h``'s ``Experts``) does these steps in this order; the PyTorch path here is its
readable reference (bits may differ in the router's dot products and the activation, as elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from quickdraft.runtime.native.linear import QuantizedLinear


@dataclass
class Experts:
    router: torch.Tensor  # [E, H] float32
    gate_up: list[QuantizedLinear]  # per expert: H -> 2·I
    down: list[QuantizedLinear]  # per expert: I -> H
    top_k: int
    normalize: bool  # the chosen probabilities over their sum
    shared_gate: torch.Tensor | None = None  # [H] float32: the shared expert's gate (None: no shared expert)
    shared: tuple[QuantizedLinear, QuantizedLinear] | None = None  # its gate/up (H -> 2·I) and down (I -> H)

    def __post_init__(self) -> None:
        experts = self.router.shape[0]
        if not (len(self.gate_up) == len(self.down) == experts and 1 <= self.top_k <= experts):
            raise ValueError(f"{experts} experts need a gate/up and a down layer each and 1..{experts} per token")
        if (self.shared_gate is None) != (self.shared is None):
            raise ValueError("a shared expert needs its gate, and a gate its expert")

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed rows ``x [R, H]`` -> (chosen experts ``[R, k]`` by descending probability, their weights
        ``[R, k]``), row by row (a row's logits never come from a call of other shape)."""
        logits = torch.stack([self.router @ row for row in x.float()]) if len(x) else x.new_empty(0, len(self.router))
        probabilities = torch.softmax(logits, dim=-1)  # [R, E]
        # ties to the lower expert number: a stable sort of the negated probabilities
        chosen = torch.sort(-probabilities, dim=-1, stable=True).indices[:, : self.top_k]  # [R, k]
        weights = probabilities.gather(1, chosen)  # [R, k]
        if self.normalize:
            total = weights[:, :1].clone()
            for rank in range(1, self.top_k):  # in rank order, as the kernel adds them
                total = total + weights[:, rank : rank + 1]
            weights = weights / total
        return chosen, weights

    def __call__(self, x: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Normed rows ``x [R, H]`` -> the mixture's output ``[R, H]`` (module docstring's rules)."""
        chosen, weights = self.route(x)
        out = torch.zeros_like(x)

        def mlp(gate_up: QuantizedLinear, down: QuantizedLinear, rows: torch.Tensor) -> torch.Tensor:  # [n, H]
            gate, up = gate_up(x[rows]).chunk(2, dim=-1)  # [n, I] each
            return down(activation(gate) * up)

        for expert in range(len(self.gate_up)):
            rows, rank = torch.nonzero(chosen == expert, as_tuple=True)  # ascending rows
            if len(rows):
                y = mlp(self.gate_up[expert], self.down[expert], rows)  # [n, H]
                out[rows] = out[rows] + weights[rows, rank][:, None] * y
        if self.shared is not None and self.shared_gate is not None and len(x):
            shared_weights = torch.sigmoid(torch.stack([self.shared_gate @ row for row in x.float()]))  # [R]
            out = out + shared_weights[:, None] * mlp(*self.shared, torch.arange(len(x)))
        return out

    def kernel_spec(self, kernels: Any) -> Any:
        """The mixture as ``layers.h`` takes it: the shared expert, if any, after the routed ones, and its gate
        (empty: none)."""
        shared = list(self.shared or ())
        gate_up = [linear.kernel_spec(kernels) for linear in [*self.gate_up, *shared[:1]]]
        down = [linear.kernel_spec(kernels) for linear in [*self.down, *shared[1:]]]
        shared_gate = torch.empty(0) if self.shared_gate is None else self.shared_gate
        return kernels.Experts(self.router, gate_up, down, self.top_k, self.normalize, shared_gate)

    def state(self, name: str) -> dict[str, torch.Tensor]:
        """Tensors for the native weight cache: ``NAME.router``, each expert's ``NAME.E.gate_up``/``.down``, and a
        shared expert's ``NAME.shared_gate`` and ``NAME.shared.gate_up``/``.down``."""
        state = {f"{name}.router": self.router}
        for expert, (gate_up, down) in enumerate(zip(self.gate_up, self.down, strict=True)):
            state |= gate_up.state(f"{name}.{expert}.gate_up") | down.state(f"{name}.{expert}.down")
        if self.shared is not None and self.shared_gate is not None:
            state[f"{name}.shared_gate"] = self.shared_gate
            state |= self.shared[0].state(f"{name}.shared.gate_up") | self.shared[1].state(f"{name}.shared.down")
        return state

    @classmethod
    def from_state(cls, name: str, state: dict[str, torch.Tensor], passes: int, top_k: int, normalize: bool) -> Experts:
        router = state[f"{name}.router"].float().contiguous()
        experts = range(router.shape[0])
        gate_up = [QuantizedLinear.from_state(f"{name}.{e}.gate_up", state, passes) for e in experts]
        down = [QuantizedLinear.from_state(f"{name}.{e}.down", state, passes) for e in experts]
        if f"{name}.shared_gate" not in state:
            return cls(router, gate_up, down, top_k, normalize)
        shared_gate = state[f"{name}.shared_gate"].float().reshape(-1).contiguous()
        shared_gate_up = QuantizedLinear.from_state(f"{name}.shared.gate_up", state, passes)
        shared_down = QuantizedLinear.from_state(f"{name}.shared.down", state, passes)
        return cls(router, gate_up, down, top_k, normalize, shared_gate, (shared_gate_up, shared_down))

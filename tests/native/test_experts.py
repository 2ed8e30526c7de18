"""A mixture of experts' routing and loading (``experts.py``): the compiled router against the PyTorch one, its
ties, its weights with and without renormalization, a shared expert's gate, and a model's experts read from its
files' per-expert names as from transformers' in-memory layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import native_from_hf
from test_families import build

from quickdraft.runtime.base import LoadOptions
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.experts import Experts
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.linear import QuantizedLinear


def experts(router: torch.Tensor, top_k: int, normalize: bool) -> Experts:
    """A mixture around ``router [E, H]`` whose experts are never run (routing only)."""
    width = router.shape[1]
    linear = QuantizedLinear.from_float(torch.zeros(2 * width, width))
    return Experts(router, [linear] * len(router), [linear] * len(router), top_k, normalize)


@pytest.mark.parametrize("normalize", [True, False])
def test_the_compiled_router_chooses_as_the_reference_does(normalize: bool) -> None:
    kernels = native_kernels()
    if kernels is None:
        pytest.skip("the kernels do not build here")
    generator = torch.Generator().manual_seed(0)
    router = torch.randn(16, 64, generator=generator)
    x = torch.randn(40, 64, generator=generator)
    chosen, weights = kernels.route(x, router, 4, normalize)
    reference_chosen, reference_weights = experts(router, 4, normalize).route(x)
    assert torch.equal(chosen, reference_chosen)
    assert torch.allclose(weights, reference_weights, rtol=1e-5, atol=1e-7)
    probabilities = torch.softmax(x @ router.T, dim=-1)
    assert (weights[:, :-1] >= weights[:, 1:]).all()  # descending
    if normalize:
        assert torch.allclose(weights.sum(-1), torch.ones(40), atol=1e-6)
    else:
        assert torch.allclose(weights, probabilities.gather(1, chosen), rtol=1e-5)


def test_a_tie_goes_to_the_lower_expert() -> None:
    router = torch.zeros(4, 8)
    router[:, 0] = torch.tensor([1.0, 2.0, 2.0, 1.0])  # experts 1 and 2 tie for the top
    x = torch.ones(1, 8)
    kernels = native_kernels()
    choices = [experts(router, 2, True).route(x)[0]]
    if kernels is not None:
        choices.append(kernels.route(x, router, 2, True)[0])
    assert all(chosen.tolist() == [[1, 2]] for chosen in choices)
    assert experts(router, 1, True).route(x)[0].tolist() == [[1]]


def test_the_compiled_shared_gate_is_the_sigmoid_of_a_dot_product() -> None:
    kernels = native_kernels()
    if kernels is None:
        pytest.skip("the kernels do not build here")
    generator = torch.Generator().manual_seed(5)
    x, gate = torch.randn(40, 64, generator=generator), torch.randn(64, generator=generator)
    weights = kernels.sigmoid_gate(x, gate)  # [R]
    assert torch.allclose(weights, torch.sigmoid(x @ gate), rtol=1e-5, atol=1e-7)
    assert torch.equal(kernels.sigmoid_gate(x[7:9], gate), weights[7:9])  # a row's weight whatever rows come with it


def test_a_mixture_needs_its_experts_and_a_valid_count() -> None:
    with pytest.raises(ValueError, match=r"1\.\.4 per token"):
        experts(torch.zeros(4, 8), 5, True)
    with pytest.raises(ValueError, match="a shared expert needs its gate"):
        mixture = experts(torch.zeros(4, 8), 2, True)
        Experts(mixture.router, mixture.gate_up, mixture.down, 2, True, shared_gate=torch.zeros(8))


@pytest.mark.parametrize("family", ["qwen3-moe", "mixtral", "qwen2-moe"])
def test_a_saved_directory_gives_the_bits_of_the_model_in_memory(family: str, tmp_path: Path) -> None:
    """Saved, the experts are one tensor each under the family's names (``block_sparse_moe.experts.E.w1`` for
    Mixtral); in memory, transformers holds them fused (``mlp.experts.gate_up_proj``). Both load to the same parts,
    Qwen2-MoE's shared expert and its gate too."""
    model = build(family)
    model.save_pretrained(tmp_path)
    loaded = NativeRuntime.load(tmp_path, LoadOptions(max_context=256))
    token_ids = torch.randint(0, 60, (1, 16), generator=torch.Generator().manual_seed(0))
    in_memory = native_from_hf(model)
    expected = in_memory.forward(token_ids, in_memory.new_cache())
    assert torch.equal(loaded.forward(token_ids, loaded.new_cache()), expected)


@pytest.mark.parametrize("family", ["qwen3-moe", "qwen2-moe"])
def test_requests_batched_together_get_their_own_bits(family: str) -> None:
    """Several requests' rows in one forward (the server's batch), routed to experts they share or not, and all
    through a shared expert: each gets bitwise the logits of its own forward alone."""
    from quickdraft.runtime.base import BatchRow

    runtime = native_from_hf(build(family))
    generator = torch.Generator().manual_seed(4)
    histories = [torch.randint(0, 60, (n,), generator=generator).tolist() for n in (6, 13, 2)]
    new_tokens = [[7, 3, 9, 1], [11], [4, 50, 4]]

    def cache_after(history: list[int]):  # -> the runtime's cache holding history
        cache = runtime.new_cache(1)
        runtime.forward(torch.tensor([history]), cache)
        return cache

    pairs = list(zip(histories, new_tokens, strict=True))
    alone = [runtime.forward(torch.tensor([new]), cache_after(history))[0] for history, new in pairs]
    rows = [BatchRow(cache_after(history), new) for history, new in pairs]
    for expected, got in zip(alone, runtime.forward_batch(rows), strict=True):
        assert torch.equal(got, expected)

"""The native runtime's bits do not depend on how many threads compute them: every kernel splits its work into
pieces that each thread computes whole (output columns, rows, query heads), never a sum across threads.

Under pytest-xdist each worker computes on its share of the cores (tests/conftest.py: one thread each on two cores),
so this is where more than one thread computes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import native_from_hf, tiny_model, write_tiny_gguf
from test_families import build

from quickdraft.models.loading import resolve_model
from quickdraft.runtime import Runtime
from quickdraft.runtime.native import NativeRuntime

THREADS = (1, 2, 3)  # 3 splits the work unevenly (the GGUF model's 512 columns are 32 pieces of 16)


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def logits_on(runtime: Runtime, num_threads: int) -> list[torch.Tensor]:
    """A prompt, a verify block of 9 and one step after it, computed on ``num_threads`` threads."""
    torch.set_num_threads(num_threads)
    cache = runtime.new_cache(1)
    return [
        runtime.forward(torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]), cache),  # [1, 11, V]
        runtime.forward(torch.tensor([[8, 9, 7, 9, 3, 2, 3, 8, 4]]), cache),  # [1, 9, V]
        runtime.forward(torch.tensor([[6]]), cache),  # [1, 1, V]
    ]


def assert_the_same_bits_on_every_thread_count(runtime: Runtime) -> None:
    one = logits_on(runtime, THREADS[0])
    for num_threads in THREADS[1:]:
        assert all(map(torch.equal, one, logits_on(runtime, num_threads))), num_threads


def test_int8_logits_are_the_same_bits_on_any_number_of_threads(threads: None) -> None:
    assert_the_same_bits_on_every_thread_count(native_from_hf(tiny_model(32, seed=0)))


@pytest.mark.parametrize("family", ["qwen3-moe", "qwen2-moe"])
def test_a_mixtures_logits_are_the_same_bits_on_any_number_of_threads(threads: None, family: str) -> None:
    """Each chosen expert's GEMMs (and a shared expert's) split their output columns among the threads."""
    assert_the_same_bits_on_every_thread_count(native_from_hf(build(family)))


def test_q4_and_q6_logits_are_the_same_bits_on_any_number_of_threads(
    threads: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    runtime = NativeRuntime.load(resolve_model(write_tiny_gguf(tmp_path / "tiny.gguf"), progress=False))
    assert_the_same_bits_on_every_thread_count(runtime)

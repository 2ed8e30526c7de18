"""Is a drafted token's forward more than its GEMMs? A probe, kept beside its output.

    .venv/bin/python results/xeon-167/sampled-levers/draft_gemm_share.py

Times the default draft model's forward of one row at 300 cached tokens (median and minimum of 40, after 5 warm-up
calls), then its 97 GEMMs (4 per layer and the LM head over its focused vocabulary) called one by one from Python on
the same weights with random int8 rows, then the Python and row-quantizing part of that loop alone, and the bytes of
the weights those GEMMs read.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from quickdraft.api import Pipeline
from quickdraft.runtime.native.kernels import native_kernels

REPEATS, WARMUP, CACHED = 40, 5, 300
LINEARS = ("qkv", "out", "gate_up", "down")


def timed(name: str, call: Callable[[], None]) -> None:
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print(f"{name}: median {statistics.median(times) * 1e3:.2f} ms, min {min(times) * 1e3:.2f} ms")


def main() -> None:
    draft = Pipeline.load().draft
    decoder, kernels = draft.decoder, native_kernels()
    cache = draft.new_cache(1)
    draft.forward(torch.tensor([list(range(1000, 1000 + CACHED))]), cache, last_only=True)

    def forward() -> None:
        cache.truncate(CACHED)
        draft.forward(torch.tensor([[1234]]), cache, last_only=True)

    linears = [getattr(layer, name) for layer in decoder.layers for name in LINEARS] + [decoder.lm_head]

    def gemms() -> None:
        for linear in linears:
            rows, _ = kernels.quantize_rows(torch.randn(1, linear.in_features), linear.passes)
            linear.matmul_rows(rows)

    def loop_alone() -> None:
        for linear in linears:
            kernels.quantize_rows(torch.randn(1, linear.in_features), linear.passes)

    timed(f"draft forward, 1 row at {CACHED} cached", forward)
    timed(f"its {len(linears)} GEMMs alone", gemms)
    timed("the loop without the GEMMs", loop_alone)
    weight_bytes = sum(t.nbytes for linear in linears for part in linear.parts for t in part.tensors().values())
    print(f"weights those GEMMs read: {weight_bytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

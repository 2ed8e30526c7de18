"""A 1-token forward of each model at 256 placeholder positions, split into its layers and its LM head (final norm
included), on 2 threads and on 1: where a drafted token's time goes before the engine adds anything (medians and
minima of 30 after 3 untimed):

    cd /tmp && .venv/bin/python results/xeon-167/step-overheads/draft_parts.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from quickdraft.api import Pipeline

CONTEXT = 256


def timed(function: Callable[[], object], repeats: int = 30) -> str:
    for _ in range(3):
        function()
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        function()
        times.append(1000 * (time.perf_counter() - tick))
    return f"{statistics.median(times):.2f}/{min(times):.2f}"


def parts(name: str, runtime: Any) -> None:
    decoder, cache = runtime.decoder, runtime.new_cache()
    runtime.fill_placeholder(cache, CONTEXT)
    keys, values = cache.static.slots()
    token = torch.tensor([[100]])  # [1, 1]
    hidden = torch.randn(1, decoder.config.hidden_size)  # [1, H]

    def forward() -> None:
        decoder.forward(token, cache.static, last_only=True)
        cache.truncate(CONTEXT)

    def layers() -> None:
        decoder._decode_rows(token[0], keys, values, [0], [CONTEXT])

    for threads in (2, 1):
        torch.set_num_threads(threads)
        print(f"{name} ({decoder.config.num_layers} layers), {threads} threads, ms median/min: forward "
              f"{timed(forward)}, layers {timed(layers)}, head {timed(lambda: decoder._head(hidden))}")  # fmt: skip
    torch.set_num_threads(2)


def main() -> None:
    pipeline = Pipeline.load(progress=False)
    parts("target", pipeline.target)
    parts("draft", pipeline.draft)


if __name__ == "__main__":
    main()

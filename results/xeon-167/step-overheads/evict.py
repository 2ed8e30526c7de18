"""Does the L3 serve a model's weights read again soon? Each model's LM head and 1-token forward (256 placeholder
positions, 2 threads) timed repeated back to back and right after a pass reading 2 GB of other memory; then each model's
forward right after the other model's and right after its own (medians of 20 after 3 untimed):

    cd /tmp && .venv/bin/python results/xeon-167/step-overheads/evict.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from quickdraft.api import Pipeline

CONTEXT = 256
Step = Callable[[], object]


def median_ms(function: Step, before: Step | None = None, repeats: int = 20) -> float:
    for _ in range(3):
        function()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        tick = time.perf_counter()
        function()
        times.append(1000 * (time.perf_counter() - tick))
    return statistics.median(times)


def one_token_forward(runtime: Any) -> Step:
    cache = runtime.new_cache()
    runtime.fill_placeholder(cache, CONTEXT)
    token = torch.tensor([[100]])  # [1, 1]

    def forward() -> None:
        runtime.decoder.forward(token, cache.static, last_only=True)
        cache.truncate(CONTEXT)

    return forward


def main() -> None:
    pipeline = Pipeline.load(progress=False)
    other_memory = torch.ones(2 * 1024**3 // 4)  # 2 GB

    def evict() -> None:
        other_memory.sum()  # a read: no dirty lines for the next forward to write back

    forwards = {}
    for name, runtime in (("target", pipeline.target), ("draft", pipeline.draft)):
        hidden = torch.randn(1, runtime.decoder.config.hidden_size)  # [1, H]
        head = lambda runtime=runtime, hidden=hidden: runtime.decoder._head(hidden)  # noqa: E731
        forward = forwards[name] = one_token_forward(runtime)
        print(f"{name}: head repeated {median_ms(head):.2f} ms, after 2 GB of other memory {median_ms(head, evict):.2f}"
              f"; forward repeated {median_ms(forward):.2f}, after 2 GB {median_ms(forward, evict):.2f}")  # fmt: skip
    target, draft = forwards["target"], forwards["draft"]
    print(f"draft forward after a target forward {median_ms(draft, target):.2f} ms, after a draft forward "
          f"{median_ms(draft, draft):.2f}; target forward after a draft forward {median_ms(target, draft):.2f}, after "
          f"a target forward {median_ms(target, target):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

"""What a seeded position's noise costs: the library's (computed in place since `769266b`) against the same formula
with temporaries (before it), taking turns at going first, 200 positions each, and that both give the same bits:

    cd /tmp && .venv/bin/python results/xeon-167/step-overheads/noise.py
"""

from __future__ import annotations

import hashlib
import statistics
import time

import numpy as np
import torch

from quickdraft.lossless.sampling import seeded_gumbel

V = 151_936  # the default pair's vocabulary


def with_temporaries(seed: int, position: int) -> torch.Tensor:
    key = hashlib.blake2b(f"token:{seed}:{position}".encode(), digest_size=16).digest()
    uniform = np.random.default_rng(int.from_bytes(key, "little")).random(V)
    uniform = torch.from_numpy(uniform).float().clamp(min=2.0**-64, max=1.0 - 2.0**-24)
    return -torch.log(-torch.log1p(-uniform))


def main() -> None:
    before: list[float] = []
    now: list[float] = []
    for position in range(200):  # each goes first on every other position
        ways = [(before, lambda p=position: with_temporaries(1, 1000 + p))]
        ways.append((now, lambda p=position: seeded_gumbel.__wrapped__(1, 1000 + p, V)))
        made = []
        for times, make in ways if position % 2 == 0 else ways[::-1]:
            tick = time.perf_counter()
            made.append(make())
            times.append(1000 * (time.perf_counter() - tick))
        assert torch.equal(made[0], made[1]), position
    print(
        f"ms a position, median of 200: with temporaries {statistics.median(before):.3f}, "
        f"in place {statistics.median(now):.3f}; the same bits at every position"
    )


if __name__ == "__main__":
    main()

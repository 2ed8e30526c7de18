"""What a seeded position's noise costs: the library's (computed in place since `769266b`) against the same formula
with temporaries (before it), alternating, 200 positions each, and that both give the same bits:

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
    before, now = [], []
    for position in range(200):
        tick = time.perf_counter()
        reference = with_temporaries(1, 1000 + position)
        before.append(1000 * (time.perf_counter() - tick))
        tick = time.perf_counter()
        noise = seeded_gumbel.__wrapped__(1, 1000 + position, V)
        now.append(1000 * (time.perf_counter() - tick))
        assert torch.equal(noise, reference), position
    print(
        f"ms a position, median of 200: with temporaries {statistics.median(before):.3f}, "
        f"in place {statistics.median(now):.3f}; the same bits at every position"
    )


if __name__ == "__main__":
    main()

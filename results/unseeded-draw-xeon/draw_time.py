"""Time one unseeded draw over the default target's 151,936 tokens: torch.multinomial (before) against
quickdraft.lossless.sampling.sample (the inverse of the cumulative sum in float64), 200 draws each, three rounds.

    .venv/bin/python results/unseeded-draw-xeon/draw_time.py
"""

import time

import torch

from quickdraft.lossless.sampling import make_generator, sample

VOCABULARY = 151936


def timed(fn, n: int = 200) -> tuple[float, float]:
    """(median, fastest) milliseconds of ``n`` calls."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return 1e3 * times[len(times) // 2], 1e3 * times[0]


def main() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, VOCABULARY) * 3
    probs = (logits / 0.7).softmax(-1)
    generator = make_generator(1)
    for round_ in range(3):
        old = timed(lambda: torch.multinomial(probs, 1, generator=generator))
        new = timed(lambda: sample(probs, generator))
        softmax = timed(lambda: (logits / 0.7).softmax(-1))
        print(
            f"round {round_}: torch.multinomial median {old[0]:.3f} ms (fastest {old[1]:.3f}); "
            f"inverse cumulative sum median {new[0]:.3f} ms (fastest {new[1]:.3f}); "
            f"the softmax itself {softmax[0]:.3f} ms"
        )
    print("threads", torch.get_num_threads(), torch.__version__)


if __name__ == "__main__":
    main()

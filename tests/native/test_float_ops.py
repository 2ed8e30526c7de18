from fractions import Fraction

import numpy as np
import torch

from quickdraft.runtime.native.float_ops import fused_multiply_add


def correctly_rounded(exact: Fraction) -> np.float32:
    """The float32 nearest ``exact``, ties to an even significand: the candidates around float64's rounding."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    distance = [abs(Fraction(float(c)) - exact) for c in candidates]
    best = min(distance)
    ties = [c for c, d in zip(candidates, distance, strict=True) if d == best]
    return min(ties, key=lambda c: int(np.array(c).view(np.int32)) & 1)


def test_fused_multiply_add_rounds_once():
    generator = torch.Generator().manual_seed(0)
    count = 4000
    a = torch.randn(count, generator=generator) * 2.0 ** torch.randint(-20, 20, (count,), generator=generator)
    b = torch.randn(count, generator=generator) * 2.0 ** torch.randint(-20, 20, (count,), generator=generator)
    # products halfway between two float32 values (a · 3 with 25 significant bits), moved off by an addend far
    # below float64's last bit: rounding twice lands on the tie and goes to even, whichever side the addend is
    b[: count // 2] = 3.0
    sign = torch.randint(0, 2, (count,), generator=generator).float() * 2 - 1
    c = sign * (a.double() * b.double()).abs().float() * 2.0**-60
    # and addends near the product's size, which cancel most of it
    c[count // 2 :] = (-(a * b) * (1 + torch.randn(count, generator=generator) * 2.0**-20))[count // 2 :]
    fused = fused_multiply_add(a, b, c)
    twice = (a.double() * b.double() + c.double()).float()
    wrong_twice = 0
    for i in range(count):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        expected = correctly_rounded(exact)
        assert np.float32(fused[i].item()) == expected, (a[i], b[i], c[i])
        wrong_twice += np.float32(twice[i].item()) != expected
    assert wrong_twice > 0  # the negative control: rounding in float64 and then in float32 differs somewhere

"""The report's words for how a run chose its tokens, for every kind of run and number of runs."""

from __future__ import annotations

import pytest

from quickdraft.bench.report import decoding

UNSEEDED = "sampled at temperature 0.7 (unseeded)"


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"greedy": True, "runs": 3}, "greedy"),
        ({"greedy": False, "temperature": 0.7, "sampling_seed": None, "runs": 1}, UNSEEDED),
        ({"greedy": False, "temperature": 0.7, "sampling_seed": None, "runs": 3}, UNSEEDED),
        (
            {"greedy": False, "temperature": 1.0, "sampling_seed": 2**64 - 1, "runs": 2},
            "sampled at temperature 1.0 (seeds 18446744073709551615 to 0, one a run: our methods' text must equal "
            "plain decoding's)",
        ),
        (
            {"greedy": False, "temperature": 1.0, "sampling_seed": 5, "runs": 1},
            "sampled at temperature 1.0 (seed 5: our methods' text must equal plain decoding's)",
        ),
    ],
)
def test_how_a_run_chose_its_tokens(config: dict, words: str) -> None:
    assert decoding(config) == words  # an unseeded run of several runs has no seeds to name

"""Would longer copies pay? The suffix drafter's copies replayed along the target's own answers (answers.json) under
other length rules: SuffixDecoding's max_spec_factor (suffix.LENGTH_FACTOR, drafts of at most F times the match's
length) and minimum probability (suffix.MIN_PROBABILITY). Exact for the copies' acceptance (the answers are the
target's text whatever is drafted); the speed column is a rough model that takes a copy wherever one is offered and
a plain step elsewhere, at t(1) 43.5 ms and 3 ms a verified row (the model 167 Xeon's cost curve).

    .venv/bin/python results/xeon-167/sampled-levers/copy_length.py [MAX_DRAFTS]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import quickdraft.drafters.suffix as suffix
from quickdraft.drafters.suffix import SuffixDrafter

ROW_MS, PLAIN_MS = 3.0, 43.5
RULES = [(1.0, 0.1), (1.5, 0.1), (2.0, 0.1), (3.0, 0.1), (100.0, 0.1), (2.0, 0.05), (1.0, 0.2), (2.0, 0.2)]


def main() -> None:
    answers = json.loads(Path(__file__).with_name("answers.json").read_text())
    max_drafts = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    for temperature in sorted({row["t"] for row in answers}):
        rows = [row for row in answers if row["t"] == temperature]
        print(f"T {temperature}: {len(rows)} answers, {sum(len(r['answer']) for r in rows)} tokens, γ ≤ {max_drafts}")
        for factor, min_probability in RULES:
            suffix.LENGTH_FACTOR, suffix.MIN_PROBABILITY = factor, min_probability
            drafter = SuffixDrafter()
            copy_steps = proposed = accepted = tokens = 0
            by_category: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # tokens, ms
            for row in rows:
                sequence = row["prompt"] + row["answer"]
                state = drafter.start(row["prompt"], None)
                position = len(row["prompt"])
                while position < len(sequence):
                    state.catch_up(sequence[:position])
                    drafts = drafter.continuation(state, max_drafts)
                    kept = 0
                    while (
                        kept < len(drafts)
                        and sequence[position + kept : position + kept + 1] == drafts[kept : kept + 1]
                    ):
                        kept += 1
                    if drafts:
                        copy_steps, proposed, accepted = copy_steps + 1, proposed + len(drafts), accepted + kept
                    gained = min(kept + 1, len(sequence) - position)
                    by_category[row["category"]][0] += gained
                    by_category[row["category"]][1] += PLAIN_MS + ROW_MS * len(drafts)
                    tokens += gained
                    position += gained
                state.catch_up(sequence)
                drafter.finish(state)
            speed = tokens / sum(ms for _, ms in by_category.values()) * PLAIN_MS
            categories = " ".join(f"{c[:5]} {t / ms * PLAIN_MS:.3f}" for c, (t, ms) in sorted(by_category.items()))
            print(
                f"  F {factor:<5} P {min_probability:<4} copy steps {copy_steps:4d} drafts a step "
                f"{proposed / max(copy_steps, 1):.2f} accepted {accepted / max(copy_steps, 1):.2f} "
                f"speed vs plain {speed:.3f} | {categories}"
            )


if __name__ == "__main__":
    main()

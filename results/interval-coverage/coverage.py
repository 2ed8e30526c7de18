"""How often the bench's 95 % speedup interval (``metrics.speedup_interval``: a percentile bootstrap over questions)
holds the true speedup, with n questions. The population is a recorded run's questions (run 0): the true speedup
is the whole run's; each trial draws n of its questions with replacement and asks ``speedup_interval`` for their
interval, as a report of n questions would give it.

    python results/interval-coverage/coverage.py RUN_DIR METHOD [--trials 400] [--sizes 5,10,30]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

from quickdraft.bench import metrics
from quickdraft.bench.metrics import Entry


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("method")
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--sizes", default="5,10,30")
    args = parser.parse_args()
    metrics.BOOTSTRAP_RESAMPLES = 1000  # per trial; the report's 2000 changes the endpoints by Monte-Carlo noise
    entries = [Entry.from_dict(json.loads(line)) for line in (args.run / "entries.jsonl").read_text().splitlines()]
    ours = {e.question_id: e for e in entries if e.method == args.method and e.run == 0}
    theirs = {e.question_id: e for e in entries if e.method == "baseline" and e.run == 0}
    questions = sorted(ours.keys() & theirs.keys())
    true_speedup = sum(ours[q].tokens_per_s for q in questions) / sum(theirs[q].tokens_per_s for q in questions)
    rng = random.Random(1)
    print(f"{args.run} {args.method}: {len(questions)} questions, true speedup {true_speedup:.3f}")
    for size in (int(s) for s in args.sizes.split(",")):
        held = 0
        for _ in range(args.trials):
            drawn = [rng.choice(questions) for _ in range(size)]  # a sample of n questions, renamed apart
            sample = [dataclasses.replace(ours[q], question_id=str(i)) for i, q in enumerate(drawn)]
            base = [dataclasses.replace(theirs[q], question_id=str(i)) for i, q in enumerate(drawn)]
            interval = metrics.speedup_interval(sample, base)
            held += interval is not None and interval[0] <= true_speedup <= interval[1]
        print(f"  n = {size:2d}: the 95 % interval held the true speedup in {held / args.trials:.3f} of {args.trials}")


if __name__ == "__main__":
    main()

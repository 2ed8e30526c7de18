"""After ÷ before per question (tokens/s averaged over each version's runs), per method, with a 95 % bootstrap
interval over questions; and the A/A controls: `control` ÷ `baseline` within each version (plain decoding timed
twice in the same runs), and each version's second run ÷ its first (the same code run again).

    python compare.py BEFORE/entries.jsonl AFTER/entries.jsonl [BEFORE_RUNS]

BEFORE_RUNS (e.g. 1,2): only those runs of the before version count (a run disturbed by other work left out)."""

import json
import random
import statistics
import sys
from collections import defaultdict


def entries(path):
    with open(path) as file:
        return [json.loads(line) for line in file]


def per_question(rows, run=None):
    runs = defaultdict(lambda: defaultdict(list))  # method -> question -> [tok/s per run]
    for entry in rows:
        if run is None or entry["run"] == run:
            runs[entry["method"]][entry["question_id"]].append(entry["new_tokens"] / entry["wall_time_s"])
    return {method: {q: statistics.mean(v) for q, v in qs.items()} for method, qs in runs.items()}


def ratio_line(label, numerator, denominator, rng):
    questions = sorted(set(numerator) & set(denominator))
    ratios = [numerator[q] / denominator[q] for q in questions]
    boot = sorted(statistics.mean(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return f"{label:44} {statistics.mean(ratios):.3f} (95% {boot[50]:.3f}-{boot[1949]:.3f}) over {len(questions)}"


before_rows, after_rows = entries(sys.argv[1]), entries(sys.argv[2])
if len(sys.argv) > 3:
    kept = {int(run) for run in sys.argv[3].split(",")}
    before_rows = [entry for entry in before_rows if entry["run"] in kept]
before, after = per_question(before_rows), per_question(after_rows)
rng = random.Random(0)
for method in after:
    print(ratio_line(f"{method}: after / before", after[method], before[method], rng))
    speeds = [statistics.mean(table[method].values()) for table in (before, after)]
    print(f"{'':44} tok/s {speeds[0]:.2f} -> {speeds[1]:.2f}")
for name, table in (("before", before), ("after", after)):
    print(ratio_line(f"A/A {name}: control / baseline", table["control"], table["baseline"], rng))
    print(ratio_line(f"{name}: hybrid+goodput / baseline", table["hybrid+goodput"], table["baseline"], rng))
for name, rows in (("before", before_rows), ("after", after_rows)):
    first_run, second_run = sorted({entry["run"] for entry in rows})[:2]
    first, second = per_question(rows, first_run), per_question(rows, second_run)
    for method in first:
        print(ratio_line(f"A/A {name}: run 2 / run 1, {method}", second[method], first[method], rng))
lossless = all(
    entry["token_ids"] == plain["token_ids"]
    for rows in (before_rows, after_rows)
    for entry in rows
    for plain in rows
    if plain["method"] == "baseline"
    and (plain["question_id"], plain["run"]) == (entry["question_id"], entry["run"])
    and plain.get("turn", 0) == entry.get("turn", 0)
)
print(f"every answer plain decoding's, token for token: {lossless}")
